/** The tick loop's injected clock and timers, advanced by hand: each timer fires exactly when, and as late as, the test says. */
import type { Timers } from '../../src/sampling/tick-loop.js';

/** A monotonic clock and a timer queue the test advances by hand. */
export class ManualTime implements Timers {
  now = 5_000_000_000n; // an arbitrary origin, not 0
  private seq = 0;
  private queue: { at: bigint; seq: number; fn: () => void }[] = [];

  readonly clock = (): bigint => this.now;

  setTimeout(fn: () => void, ms: number): unknown {
    const t = { at: this.now + BigInt(Math.round(ms * 1e6)), seq: this.seq++, fn };
    this.queue.push(t);
    return t;
  }

  clearTimeout(handle: unknown): void {
    this.queue = this.queue.filter((t) => t !== handle);
  }

  get pending(): number {
    return this.queue.length;
  }

  /** When the earliest timer is due. */
  get nextAt(): bigint {
    return this.sorted()[0]!.at;
  }

  /** Fires the earliest timer `lateNs` after its due time (the clock jumps there). */
  fire(lateNs = 0n): void {
    const t = this.sorted()[0];
    if (!t) throw new Error('no timer pending');
    this.queue = this.queue.filter((x) => x !== t);
    this.now = t.at + lateNs;
    t.fn();
  }

  private sorted() {
    return [...this.queue].sort((a, b) => (a.at === b.at ? a.seq - b.seq : a.at < b.at ? -1 : 1));
  }
}
