/**
 * QEMU's garbage, kept apart (docs/guest-energy.md, "Limits"). A window answered from a forecast
 * (forecast-window.ts) can, in one case, give QEMU a non-zero e_delta on a package where a thread
 * it listed exited: an exit and a new thread in the same window keep the thread count the forecast
 * checks. QEMU's u64 tick delta of that thread then underflows and its share, up to 2^63 units, goes
 * into its never-reset e_ratio, which it credits to every vCPU, divided by its vCPU count, window
 * after window until it has decayed. The helper cannot take that back from the guest. It runs a
 * shadow of QEMU's loop from that window on, the same but for the underflowed delta (counted 0),
 * and counts, per window, what the shadow credits (at most what the guest's counters show) against
 * what it owes: the garbage is neither carried nor lets the guest go uncredited while it decays.
 * Pure.
 */
import { copyLoopState, deltaTicks, runIteration, type LoopState, type LoopThread } from './qemu-vmsr-loop.js';

const U64_HALF = 1n << 63n;

/** A thread whose tick delta, as QEMU computes it, underflows (it exited, or its tid is another thread's). */
function underflowed(t: LoopThread): boolean {
  return deltaTicks(t) >= U64_HALF;
}

/**
 * The shadow to run beside QEMU's loop for this window: the one already running, or a copy of the
 * loop now when a thread underflows on a package given a non-zero e_delta; undefined otherwise.
 */
export function shadowFor(
  loop: LoopState,
  running: LoopState | undefined,
  threads: readonly LoopThread[],
  eDelta: ReadonlyMap<number, bigint>,
): LoopState | undefined {
  if (running !== undefined) return running;
  return threads.some((t) => underflowed(t) && (eDelta.get(t.pkg) ?? 0n) > 0n) ? copyLoopState(loop) : undefined;
}

/** The shadow's credit for the window (changed in place): QEMU's iteration with every underflowed delta counted 0. */
export function shadowCredit(
  shadow: LoopState,
  w: { threads: readonly LoopThread[]; eDelta: ReadonlyMap<number, bigint>; maxTicks: ReadonlyMap<number, number> },
): number {
  const threads = w.threads.map((t) => (underflowed(t) ? { ...t, ticks1: t.ticks0 } : t));
  let sum = 0;
  for (const c of runIteration(shadow, { ...w, threads })) sum += Number(c);
  return sum;
}

/** Whether QEMU's loop has shed the garbage: its carried shares are the shadow's again. */
export function garbageGone(loop: LoopState, shadow: LoopState): boolean {
  for (const [p, r] of loop.eRatio) if ((shadow.eRatio.get(p) ?? 0n) !== r) return false;
  return true;
}
