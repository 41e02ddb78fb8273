/**
 * The sampling loop behind v2: one sample every `intervalMs` while at least one registered VM is
 * live or a hold is taken (discovery on, see hold()), fed to the ratio engine (and the trace, when
 * recording). The loop is sampling/tick-loop.ts: ticks at origin + k x interval on the monotonic
 * clock, so a late tick does not push the next one back (no drift) and missed ticks are skipped (no
 * pile-up).
 */
import type { Logger } from 'pino';
import type { IntervalResult, VmOutput, VmTotals } from '../ratio/outputs.js';
import type { Sample } from '../model/sample.js';
import type { VmSpec } from '../model/vm.js';
import type { EngineState } from '../ratio/engine-state.js';
import { monotonicNs, TickLoop, type TickInfo, type Timers } from './tick-loop.js';
import { Emitter, type Disposable } from '../common/disposable.js';
import type { ThreadTotals } from '../ratio/attribution.js';
import { runInSlices } from './time-slices.js';

/** The engine surface the loop uses (RatioEngine implements it). */
export interface Engine {
  register(vm: VmSpec): number;
  unregister(vmId: number): void;
  forget(vmId: number): void;
  addSample(s: Sample): IntervalResult | null;
  output(vmId: number): VmOutput | undefined;
  /** Whether the VM has ended or is not known (cheaper than output(): nothing is built). */
  ended(vmId: number): boolean;
  nvpkg(vmId: number): number;
  activePids(): number[];
  updateVcpus(vmId: number, vcpus: VmSpec['vcpus']): void;
  /** The whole state as plain data, and its restore on an engine that has not started (RatioEngine). */
  state(): EngineState;
  restore(s: EngineState): void;
  readonly guestPowerUnit: bigint;
  /** Per-thread totals of a VM (RatioEngine.threadTotals), for the statistics fd; optional. */
  threadTotals?(vmId: number): ThreadTotals | undefined;
  /** A VM's totals into the caller's object, in place (RatioEngine.totalsInto), for the statistics files; false for no such VM. */
  totalsInto(vmId: number, into: VmTotals): boolean;
}

/** What a restart carries of the loop: the engine's state and the wall-clock time of its last sample. */
export interface SamplingState {
  engine: EngineState;
  /** CLOCK_REALTIME when the last sample was taken, ns; null before the first. */
  realtimeNs: bigint | null;
}

/** CLOCK_REALTIME in ns (ms resolution is enough to tell a restart's gap). */
const realtimeNs = (): bigint => BigInt(Date.now()) * 1_000_000n;

interface SampleSource {
  sample(pids: Iterable<number>): Sample;
  /**
   * The same sample one VM per step (Sampler.sampleSteps), run in slices with clients served between
   * them; `pids` is asked again before each read. Optional: a source without it is sampled at once.
   */
  sampleSteps?(pids: () => ReadonlySet<number>): Iterator<null, Sample>;
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
  /** The consumer's per-sample flow (the v2 service's): what a tick runs; without one a tick only takes the sample. */
  flow?: SampleFlow;
}

/**
 * A consumer's per-sample flow: the ONE method a tick calls, interval(tick), in which the consumer does
 * its work around the tick's steps. tick.take() takes the sample (in slices when the sampler can) and
 * runs the engine and the trace; tick.after(work, then) runs `then` once `work` settles (a scan done in
 * slices, clients served between them; a failure of it is logged and the tick goes on). A tick due
 * while the previous one still works is skipped.
 */
interface SampleFlow {
  interval(tick: Tick): void;
}

/** One tick's steps, for SampleFlow.interval. */
export interface Tick {
  take(seen?: SampleSeen): void;
  after(work: Promise<void> | undefined, then: () => void): void;
}

/** What the flow sees of the sample tick.take() takes. */
interface SampleSeen {
  /** The sample before the engine takes it (discovery classifies new threads from its stat lines); a throw fails the sample. */
  inspect?(s: Sample): void;
  /** The sample taken by the engine, before the onSample listeners. */
  sampled?(ev: SampleEvent): void;
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
  /** Ticks skipped because the loop was more than one interval late, or the previous tick still worked in slices. */
  skippedTicks: number;
  /**
   * Wall time of the last tick's work (the flow's, sample, engine, listeners), ns: from the tick to its
   * end, the clients served between its slices included.
   */
  lastDurationNs: bigint;
}

export class SamplingService {
  private readonly engine: Engine;
  private readonly clock: () => bigint;
  private readonly loop: TickLoop;
  /** Registered VMs whose process has not ended: the loop runs while this is not empty (or a hold is taken). */
  private readonly live = new Map<number, number>();
  /** Reasons to run with no live VM (discovery on): the loop runs while any is held. */
  private readonly holds = new Set<string>();
  private closed = false;
  /** A tick works in slices (its flow's work before the sample, or the sample, is pending); a tick due meanwhile is skipped. */
  private inTick = false;
  /** activePidSet() as last made; null when a register, unregister, restore or sample may have changed it. */
  private pidSet: ReadonlySet<number> | null = null;
  private failure: Error | null = null;
  private traceBroken = false;
  /**
   * While a sample is taken in slices: a time no later than its t_ns (taken just before it began).
   * A VM registered or unregistered meanwhile is in the engine before that sample is added, so its
   * trace record comes before the sample's, stamped with this time: the trace's times never go back.
   */
  private sliceStartNs: bigint | null = null;
  private lastRealtimeNs: bigint | null = null;
  private readonly samples: Emitter<SampleEvent>;
  private readonly failures: Emitter<Error>;
  readonly stats: SamplingStats = { samples: 0, failures: 0, lastLatenessNs: 0n, skippedTicks: 0, lastDurationNs: 0n };

  constructor(private readonly o: SamplingServiceOptions) {
    if (!(o.intervalMs > 0) || !Number.isFinite(o.intervalMs))
      throw new RangeError(`interval must be a positive number of ms, got ${o.intervalMs}`);
    this.engine = o.engine;
    this.samples = new Emitter((e) => o.log.error({ err: (e as Error).message }, 'sample listener failed'));
    this.failures = new Emitter((e) => o.log.error({ err: (e as Error).message }, 'failure listener failed'));
    this.clock = o.clock ?? monotonicNs;
    this.loop = new TickLoop({
      intervalNs: BigInt(Math.round(o.intervalMs * 1e6)),
      tick: (t) => this.tick(t),
      clock: this.clock,
      timers: o.timers,
    });
  }

  get running(): boolean {
    return this.loop.running;
  }

  /** Keeps the loop running (or lets it go idle) for `reason`, independent of live VMs. */
  hold(reason: string, on: boolean): void {
    if (on) this.holds.add(reason);
    else this.holds.delete(reason);
    if (this.closed) return;
    if (this.shouldRun()) {
      // A baseline right away, as for a first registration.
      if (!this.loop.running) this.loop.start({ immediate: true });
    } else {
      this.loop.stop();
    }
  }

  private shouldRun(): boolean {
    return this.live.size > 0 || this.holds.size > 0;
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
    this.pidSet = null;
    this.live.set(vmId, spec.pid);
    this.traced(() => this.o.trace?.register(this.traceNow(), spec));
    // A baseline right away, so a new VM's first UPDATE comes one interval after it registered.
    if (!this.loop.running) this.loop.start({ immediate: true });
    return vmId;
  }

  /** Withdraws a VM and drops its state; the loop goes idle at once when no live VM is left. */
  unregister(vmId: number): void {
    const out = this.engine.output(vmId);
    if (out === undefined) return;
    this.engine.unregister(vmId);
    this.pidSet = null;
    this.engine.forget(vmId);
    this.live.delete(vmId);
    if (!this.shouldRun()) this.loop.stop();
    if (!this.closed) this.traced(() => this.o.trace?.unregister(this.traceNow(), out.pid));
    if (!this.engine.activePids().includes(out.pid)) this.o.forgetPid?.(out.pid);
  }

  output(vmId: number): VmOutput | undefined {
    return this.engine.output(vmId);
  }

  nvpkg(vmId: number): number {
    return this.engine.nvpkg(vmId);
  }

  /** A VM's per-thread totals (vCPU energy and ticks, other threads' ticks); undefined when the engine has none. */
  threadTotals(vmId: number): ThreadTotals | undefined {
    return this.engine.threadTotals?.(vmId);
  }

  /** A VM's totals into `into`, in place (RatioEngine.totalsInto: nothing allocated per sample); false for no such VM. */
  totalsInto(vmId: number, into: VmTotals): boolean {
    return this.engine.totalsInto(vmId, into);
  }

  /** A VM's vCPU list changed (see RatioEngine.updateVcpus); counted from the next sample. */
  updateVcpus(vmId: number, vcpus: VmSpec['vcpus']): void {
    this.engine.updateVcpus(vmId, vcpus);
  }

  /** The loop's state between samples (every call is: a tick runs to its end before anything else). */
  state(): SamplingState {
    return { engine: this.engine.state(), realtimeNs: this.lastRealtimeNs };
  }

  /**
   * Restores the engine (a new one: see RatioEngine.restore, which throws on inconsistent values) and
   * the live VMs. Nothing is sampled until resume(): the owner restores its other parts first (in
   * slices, the event loop turning meanwhile), and the first sample must see them restored.
   */
  restore(s: SamplingState): void {
    if (this.closed) throw new Error('the sampling service is closed');
    this.engine.restore(s.engine);
    this.pidSet = null;
    this.lastRealtimeNs = s.realtimeNs;
    for (const vm of s.engine.vms) if (vm.phase !== 'ended') this.live.set(vm.id, vm.pid);
  }

  /**
   * After restore() and the owner's own restore: samples at once when any VM is live, and runs on.
   * That sample closes the interval from the last one the old process took.
   */
  resume(): void {
    if (this.closed) return;
    if (this.shouldRun() && !this.loop.running) this.loop.start({ immediate: true });
  }

  close(): void {
    this.closed = true;
    this.loop.stop();
    this.samples.dispose();
    this.failures.dispose();
  }

  private tick(t: TickInfo): void {
    if (this.closed) return;
    if (this.inTick) {
      // The previous tick still works in slices (a storm of processes): this one is skipped.
      this.stats.skippedTicks++;
      return;
    }
    const began = monotonicNs();
    if (this.o.flow === undefined) return this.sampleStep(t, began);
    const tick: Tick = {
      take: (seen) => this.sampleStep(t, began, seen),
      after: (work, then) => {
        if (work === undefined) return then();
        this.inTick = true;
        const go = () => {
          this.inTick = false;
          then();
        };
        work.then(go, (e: unknown) => {
          this.prepareFailed(e);
          go();
        });
      },
    };
    try {
      this.o.flow.interval(tick);
    } catch (e) {
      this.prepareFailed(e);
    }
  }

  private prepareFailed(e: unknown): void {
    this.o.log.error({ err: (e as Error).stack ?? String(e) }, 'sampling preparation (discovery) failed; sampling goes on');
  }

  /** The sample, in slices when the sampler can (sampleSteps), then the engine. */
  private sampleStep(t: TickInfo, began: bigint, seen?: SampleSeen): void {
    // Closed or gone idle while the flow's work before it ran: no sample (what a tick of a stopped loop does).
    if (this.closed || !this.loop.running) {
      this.inTick = false;
      return;
    }
    this.stats.lastLatenessNs = t.latenessNs;
    this.stats.skippedTicks += t.skipped;
    const steps = this.o.sampler.sampleSteps?.(() => this.activePidSet());
    if (steps === undefined) {
      let s: Sample | undefined;
      try {
        s = this.o.sampler.sample(this.engine.activePids());
      } catch (e) {
        this.fail(e instanceof Error ? e : new Error(String(e)));
      }
      return this.finishTick(s, began, seen);
    }
    this.inTick = true;
    this.sliceStartNs = this.clock();
    runInSlices(steps, () => {}, { stopped: () => this.closed }).then(
      (s) => this.finishTick(s, began, seen),
      (e: unknown) => {
        this.fail(e instanceof Error ? e : new Error(String(e)));
        this.finishTick(undefined, began, seen);
      },
    );
  }

  private finishTick(s: Sample | undefined, began: bigint, seen?: SampleSeen): void {
    this.inTick = false;
    this.sliceStartNs = null;
    if (this.closed) return;
    try {
      if (s !== undefined) this.tickBody(s, seen);
    } finally {
      this.stats.lastDurationNs = monotonicNs() - began;
    }
    // A tick is pending only while the loop should run: unregister(), hold() and this stop it.
    if (!this.shouldRun()) this.loop.stop();
  }

  /** The time of a registration's or an unregistration's trace record (see sliceStartNs). */
  private traceNow(): bigint {
    return this.sliceStartNs ?? this.clock();
  }

  /** The pids of the engine's VMs, as a set made again only after a register, unregister or restore. */
  private activePidSet(): ReadonlySet<number> {
    if (this.pidSet === null) this.pidSet = new Set(this.engine.activePids());
    return this.pidSet;
  }

  /** The sample taken: the engine, the trace, the flow's sampled, the listeners (synchronously). */
  private tickBody(s: Sample, seen?: SampleSeen): void {
    let result: IntervalResult | null;
    try {
      seen?.inspect?.(s);
      result = this.engine.addSample(s);
    } catch (e) {
      this.fail(e instanceof Error ? e : new Error(String(e)));
      return;
    }
    // The engine may have ended VMs: their pids leave the set.
    this.pidSet = null;
    this.lastRealtimeNs = realtimeNs();
    this.traced(() => this.o.trace?.sample(s));
    this.stats.samples++;
    if (this.failure) {
      this.o.log.info({ err: this.failure.message }, 'energy source recovered');
      this.failure = null;
    }
    const ended: number[] = [];
    for (const [vmId, pid] of this.live) {
      if (this.engine.ended(vmId)) {
        ended.push(vmId);
        this.live.delete(vmId);
        if (!this.engine.activePids().includes(pid)) this.o.forgetPid?.(pid);
      }
    }
    const ev: SampleEvent = { tNs: s.tNs, result, ended };
    try {
      seen?.sampled?.(ev);
    } catch (e) {
      this.o.log.error({ err: (e as Error).message }, 'sample listener failed');
    }
    this.samples.fire(ev);
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
