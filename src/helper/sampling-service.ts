/**
 * The sampling loop behind v2: one sample every `intervalMs` while at least one registered VM is
 * live, fed to the ratio engine (and the trace, when recording). Ticks are scheduled from ideal
 * times on the monotonic clock (origin + k x interval): a late tick is measured by the sample's own
 * timestamp, the next one is not pushed back (no drift), and missed ticks are skipped (no pile-up).
 */
import type { Logger } from 'pino';
import type { IntervalResult, Sample, VmOutput, VmSpec } from '../ratio/types.js';
import { monotonicNs, TickLoop, type TickInfo, type Timers } from '../sampling/tick-loop.js';
import { Emitter, type Disposable } from '../ratio/disposable.js';

/** The engine surface the loop uses (RatioEngine implements it). */
export interface Engine {
  register(vm: VmSpec): number;
  unregister(vmId: number): void;
  forget(vmId: number): void;
  addSample(s: Sample): IntervalResult | null;
  output(vmId: number): VmOutput | undefined;
  nvpkg(vmId: number): number;
  activePids(): number[];
  readonly guestPowerUnit: bigint;
}

export interface SampleSource {
  sample(pids: Iterable<number>): Sample;
}

export interface TraceSink {
  register(tNs: bigint, vm: VmSpec): void;
  sample(s: Sample): void;
  unregister(tNs: bigint, pid: number): void;
}

export interface SamplingServiceOptions {
  engine: Engine;
  sampler: SampleSource;
  intervalMs: number;
  trace?: TraceSink;
  /** Per-pid state to drop once a pid is no longer sampled (ProcTaskReader.forget). */
  forgetPid?: (pid: number) => void;
  log: Logger;
  /** CLOCK_MONOTONIC in ns; the sampler must use the same clock. */
  clock?: () => bigint;
  /** Timers of the tick loop, for tests; default the real ones. */
  timers?: Timers;
}

export interface SampleEvent {
  tNs: bigint;
  result: IntervalResult | null;
  /** vmIds whose process ended with this sample: frozen from now on. */
  ended: number[];
}

export interface SamplingStats {
  samples: number;
  failures: number;
  /** How late the last tick fired after its ideal time, ns. */
  lastLatenessNs: bigint;
  /** Ticks skipped because the loop was more than one interval late. */
  skippedTicks: number;
}

export class SamplingService {
  private readonly engine: Engine;
  private readonly clock: () => bigint;
  private readonly loop: TickLoop;
  /** Registered VMs whose process has not ended: the loop runs while this is not empty. */
  private readonly live = new Map<number, number>();
  private closed = false;
  private failure: Error | null = null;
  private traceBroken = false;
  private readonly samples: Emitter<SampleEvent>;
  private readonly failures: Emitter<Error>;
  readonly stats: SamplingStats = { samples: 0, failures: 0, lastLatenessNs: 0n, skippedTicks: 0 };

  constructor(private readonly o: SamplingServiceOptions) {
    if (!(o.intervalMs > 0) || !Number.isFinite(o.intervalMs)) throw new RangeError(`interval must be a positive number of ms, got ${o.intervalMs}`);
    this.engine = o.engine;
    this.samples = new Emitter((e) => o.log.error({ err: (e as Error).message }, 'sample listener failed'));
    this.failures = new Emitter((e) => o.log.error({ err: (e as Error).message }, 'failure listener failed'));
    this.clock = o.clock ?? monotonicNs;
    this.loop = new TickLoop({ intervalNs: BigInt(Math.round(o.intervalMs * 1e6)), tick: (t) => this.tick(t), clock: this.clock, timers: o.timers });
  }

  get running(): boolean {
    return this.loop.running;
  }

  /** The energy source's last error while it is failing, null when the last sample worked. */
  get failed(): Error | null {
    return this.failure;
  }

  get guestPowerUnit(): bigint {
    return this.engine.guestPowerUnit;
  }

  /** Every sample, after the engine took it; dispose the result to stop listening. */
  onSample(cb: (e: SampleEvent) => void): Disposable {
    return this.samples.event(cb);
  }

  /** Called once when sampling starts failing (not on every failing tick); dispose to stop listening. */
  onFailure(cb: (err: Error) => void): Disposable {
    return this.failures.event(cb);
  }

  /** Registers a VM; the next sample is its baseline. Starts the loop with a sample now if it was idle. */
  register(spec: VmSpec): number {
    if (this.closed) throw new Error('the sampling service is closed');
    const vmId = this.engine.register(spec);
    this.live.set(vmId, spec.pid);
    this.traced(() => this.o.trace?.register(this.clock(), spec));
    // A baseline right away, so a new VM's first UPDATE comes one interval after it registered.
    if (!this.loop.running) this.loop.start({ immediate: true });
    return vmId;
  }

  /** Withdraws a VM and drops its state; the loop goes idle at once when no live VM is left. */
  unregister(vmId: number): void {
    const out = this.engine.output(vmId);
    if (out === undefined) return;
    this.engine.unregister(vmId);
    this.engine.forget(vmId);
    this.live.delete(vmId);
    if (this.live.size === 0) this.loop.stop();
    if (!this.closed) this.traced(() => this.o.trace?.unregister(this.clock(), out.pid));
    if (!this.engine.activePids().includes(out.pid)) this.o.forgetPid?.(out.pid);
  }

  output(vmId: number): VmOutput | undefined {
    return this.engine.output(vmId);
  }

  nvpkg(vmId: number): number {
    return this.engine.nvpkg(vmId);
  }

  close(): void {
    this.closed = true;
    this.loop.stop();
    this.samples.dispose();
    this.failures.dispose();
  }

  private tick(t: TickInfo): void {
    if (this.closed) return;
    // A tick is pending only while a VM is live: unregister() and the end of tick() stop the loop.
    this.stats.lastLatenessNs = t.latenessNs;
    this.stats.skippedTicks += t.skipped;
    let s: Sample;
    let result: IntervalResult | null;
    try {
      s = this.o.sampler.sample(this.engine.activePids());
      result = this.engine.addSample(s);
    } catch (e) {
      this.fail(e instanceof Error ? e : new Error(String(e)));
      return;
    }
    this.traced(() => this.o.trace?.sample(s));
    this.stats.samples++;
    if (this.failure) {
      this.o.log.info({ err: this.failure.message }, 'energy source recovered');
      this.failure = null;
    }
    const ended: number[] = [];
    for (const [vmId, pid] of this.live) {
      if (this.engine.output(vmId)?.ended ?? true) {
        ended.push(vmId);
        this.live.delete(vmId);
        if (!this.engine.activePids().includes(pid)) this.o.forgetPid?.(pid);
      }
    }
    const ev: SampleEvent = { tNs: s.tNs, result, ended };
    this.samples.fire(ev);
    if (this.live.size === 0) this.loop.stop();
  }

  /** A trace that cannot be written stops recording; the service itself goes on. */
  private traced(write: () => void): void {
    if (this.traceBroken) return;
    try {
      write();
    } catch (e) {
      this.traceBroken = true;
      this.o.log.error({ err: (e as Error).message }, 'trace recording failed; recording stopped, the service goes on');
    }
  }

  private fail(err: Error): void {
    this.stats.failures++;
    if (this.failure) return;
    this.failure = err;
    this.o.log.error({ err: err.message }, 'sampling failed; v2 clients get ERROR 5 until it recovers');
    this.failures.fire(err);
  }
}
