/**
 * An exporter counter fed by a daemon's cumulative value (from 0 at each daemon start): the first value and a lower one (a
 * new daemon run) are added whole, a higher one adds the difference; the total only grows.
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
