/**
 * THE sampling loop's clockwork (`record`, the daemon): ticks at origin + k x interval on a monotonic clock,
 * so a late tick pushes no later one back and missed ticks are skipped, not run in a burst. Timers injected for tests.
 */

export interface Timers {
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

const REAL_TIMERS: Timers = {
  setTimeout: (fn, ms) => setTimeout(fn, ms),
  clearTimeout: (h) => clearTimeout(h as NodeJS.Timeout),
};

export function monotonicNs(): bigint {
  return process.hrtime.bigint();
}

export interface TickInfo {
  /** Index of this tick (0 = the origin). */
  k: bigint;
  /** When it was due, and how late it fired, ns. */
  idealNs: bigint;
  latenessNs: bigint;
  /** Ticks skipped right before this one because the loop was more than one interval late. */
  skipped: number;
}

interface TickLoopOptions {
  intervalNs: bigint;
  /** Runs on every tick. If it throws, the loop stops and onError gets the error. */
  tick(info: TickInfo): void;
  onError?(err: unknown): void;
  clock?: () => bigint;
  timers?: Timers;
}

export class TickLoop {
  private readonly clock: () => bigint;
  private readonly timers: Timers;
  private handle: unknown = null;
  private active = false;
  private origin = 0n;
  private k = 0n;
  private pendingSkipped = 0;
  private endNs: bigint | null = null;
  private onEnd: (() => void) | null = null;

  constructor(private readonly o: TickLoopOptions) {
    if (o.intervalNs <= 0n) throw new RangeError(`tick interval must be positive, got ${o.intervalNs} ns`);
    this.clock = o.clock ?? monotonicNs;
    this.timers = o.timers ?? REAL_TIMERS;
  }

  /** Started and not stopped: a tick (or the end) is pending, or one is running. */
  get running(): boolean {
    return this.active;
  }

  /** Starts at origin = now: tick 0 at once (async) when `immediate`, else tick 1; with `endNs`, stops then and calls onEnd. */
  start(o: { immediate?: boolean; endNs?: bigint; onEnd?: () => void } = {}): void {
    this.stop();
    this.active = true;
    this.origin = this.clock();
    this.endNs = o.endNs ?? null;
    this.onEnd = o.onEnd ?? null;
    this.pendingSkipped = 0;
    this.k = 0n;
    if (o.immediate) this.arm(this.origin);
    else this.scheduleNext();
  }

  stop(): void {
    this.active = false;
    if (this.handle !== null) this.timers.clearTimeout(this.handle);
    this.handle = null;
  }

  private scheduleNext(): void {
    // The next tick is the first ideal time strictly after now (one exactly now has passed).
    const now = this.clock();
    const firstAfterNow = (now - this.origin) / this.o.intervalNs + 1n;
    const k = firstAfterNow > this.k + 1n ? firstAfterNow : this.k + 1n;
    this.pendingSkipped = Number(k - this.k - 1n);
    this.k = k;
    const atNs = this.origin + k * this.o.intervalNs;
    if (this.endNs !== null && atNs > this.endNs) {
      this.handle = this.timers.setTimeout(() => this.finish(), Math.max(0, Number(this.endNs - now) / 1e6));
      return;
    }
    this.arm(atNs);
  }

  private arm(atNs: bigint): void {
    const delayMs = Number(atNs - this.clock()) / 1e6;
    this.handle = this.timers.setTimeout(() => this.fire(atNs), Math.max(0, delayMs));
  }

  private fire(idealNs: bigint): void {
    this.handle = null;
    if (!this.active) return;
    const info: TickInfo = { k: this.k, idealNs, latenessNs: this.clock() - idealNs, skipped: this.pendingSkipped };
    try {
      this.o.tick(info);
    } catch (e) {
      this.stop();
      this.o.onError?.(e);
      return;
    }
    // tick() may have stopped (or restarted) the loop; schedule only if it is still this run.
    if (this.active && this.handle === null) this.scheduleNext();
  }

  private finish(): void {
    this.handle = null;
    this.active = false;
    this.onEnd?.();
  }
}
