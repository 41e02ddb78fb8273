/**
 * One exporter-side counter fed by a daemon's cumulative value (microjoules, or a request count).
 *
 * The daemon's values are cumulative within one daemon run and restart from 0 when the daemon
 * restarts. The exporter never exposes them as they are: it adds each increase to a total of its
 * own, so a daemon restart continues the series instead of making it go backwards:
 * - the first value a new total sees is added whole (what the daemon counted before we looked);
 * - a value at or above the last one adds the difference;
 * - a value below the last one means the daemon started a new run (or lost and found the VM again):
 *   all of it is new, so it is added whole.
 * Pure; the total only ever grows.
 */
export class RunningTotal {
  private sum = 0n;
  private last: bigint | null = null;

  /** Takes the daemon's next cumulative value; returns what it added to the total. */
  feed(value: bigint): bigint {
    if (value < 0n) return 0n;
    const added = this.last === null || value < this.last ? value : value - this.last;
    this.sum += added;
    this.last = value;
    return added;
  }

  get total(): bigint {
    return this.sum;
  }
}

/** Microjoules as joules (a double: exact to the microjoule up to 9 GJ, far beyond a counter's life here). */
export function ujToJoules(uj: bigint): number {
  const whole = uj / 1_000_000n;
  return Number(whole) + Number(uj - whole * 1_000_000n) / 1e6;
}
