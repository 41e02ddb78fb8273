/** Drift-free ticks, k due at origin + k x interval; ideal times already past are skipped, never run in a burst. */

/** The next tick: k, its ideal time (ns, monotonic clock), and how many were skipped because their time has passed. */
export function nextTick(originNs: bigint, intervalNs: bigint, lastK: bigint, nowNs: bigint): { k: bigint; atNs: bigint; skipped: number } {
  if (intervalNs <= 0n) throw new RangeError(`tick interval must be positive, got ${intervalNs} ns`);
  let k = lastK + 1n;
  // The first ideal time strictly after now (floor division: now is never before origin here).
  const firstAfterNow = nowNs < originNs ? 0n : (nowNs - originNs) / intervalNs + 1n;
  let skipped = 0;
  if (firstAfterNow > k) {
    skipped = Number(firstAfterNow - k);
    k = firstAfterNow;
  }
  return { k, atNs: originNs + k * intervalNs, skipped };
}
