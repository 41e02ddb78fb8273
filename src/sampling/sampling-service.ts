/**
 * The sampling loop behind v2: a tick every `intervalMs` while a VM is live or a hold is taken, and an interval's steps
 * (begin, take, attribute, trace, end) the owner's interval() calls (docs/architecture.md "One interval").
 */
import type { Logger } from 'pino';
import type { IntervalResult } from '../ratio/outputs.js';
import type { Sample } from '../model/sample.js';
import type { VmSpec } from '../model/vm.js';
import type { EngineState } from '../ratio/engine-state.js';
import { monotonicNs, TickLoop, type TickInfo, type Timers } from './tick-loop.js';
import type { RatioEngine } from '../ratio/attribution.js';
import { runInSlices, settled } from './time-slices.js';
import { realtimeNs } from '../os/libc/processes.js';
import type { Sampler } from './sampler.js';
import type { TraceWriter } from '../trace/writer.js';

/** What a restart carries of the loop: the engine's state and the wall-clock time of its last sample. */
export interface SamplingState {
  engine: EngineState;
  /** CLOCK_REALTIME when the last sample was taken, ns; null before the first. */
  realtimeNs: bigint | null;
}

export type TraceSink = Pick<TraceWriter, 'register' | 'sample' | 'unregister'>;

export interface SamplingServiceOptions {
  engine: RatioEngine;
  sampler: Pick<Sampler, 'sampleSteps'>;
  intervalMs: number;
  trace?: TraceSink;
  /** Per-pid state to drop once a pid is no longer sampled (ProcTaskReader.forget). */
  forgetPid?: (pid: number) => void;
  log: Logger;
  /** CLOCK_MONOTONIC in ns; the sampler must use the same clock. */
  clock?: () => bigint;
  timers?: Timers;
  /** What each tick runs: the owner's interval(), which calls this service's steps in order; absent: the sample, the engine and the trace. */
  interval?: (t: TickInfo) => void;
}

export interface SampleEvent {
  tNs: bigint;
  result: IntervalResult | null;
  /** vmIds whose process ended with this sample: frozen from now on. */
  ended: number[];
}

export type SamplingStats = SamplingService['stats'];

export class SamplingService {
  readonly engine: RatioEngine;
  private readonly clock: () => bigint;
  private readonly loop: TickLoop;
  /** Registered VMs whose process has not ended: the loop runs while this is not empty (or a hold is taken). */
  private readonly live = new Map<number, number>();
  /** Reasons to run with no live VM (discovery on): the loop runs while any is held. */
  private readonly holds = new Set<string>();
  private closed = false;
  /** An interval runs (between begin() and end(); in slices, a scan or the sample pending): a tick due meanwhile is skipped. */
  private inTick = false;
  /** activePidSet() as last made; null when a register, unregister, restore or sample may have changed it. */
  private pidSet: ReadonlySet<number> | null = null;
  private failure: Error | null = null;
  private traceBroken = false;
  /** While a sample is taken in slices: a time before its t_ns, for the trace records of (un)registrations meanwhile (times never go back). */
  private sliceStartNs: bigint | null = null;
  private lastRealtimeNs: bigint | null = null;
  private began = 0n;
  /**
   * lastLatenessNs: how late the last tick fired; skippedTicks: ticks more than one interval late or due while the previous
   * one worked in slices; lastDurationNs: the last interval's wall time, begin() to end(), clients served between slices included.
   */
  readonly stats = { samples: 0, failures: 0, lastLatenessNs: 0n, skippedTicks: 0, lastDurationNs: 0n };

  constructor(private readonly o: SamplingServiceOptions) {
    if (!(o.intervalMs > 0) || !Number.isFinite(o.intervalMs))
      throw new RangeError(`interval must be a positive number of ms, got ${o.intervalMs}`);
    this.engine = o.engine;
    this.clock = o.clock ?? monotonicNs;
    this.loop = new TickLoop({
      intervalNs: BigInt(Math.round(o.intervalMs * 1e6)),
      tick: o.interval ?? ((t) => this.alone(t)),
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
    if (this.shouldRun()) this.resume();
    else this.loop.stop();
  }

  private shouldRun(): boolean {
    return this.live.size > 0 || this.holds.size > 0;
  }

  /** The energy source's last error while it is failing, null when the last sample worked. */
  get failed(): Error | null {
    return this.failure;
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

  /** The loop's state between samples (every call is: a tick runs to its end before anything else). */
  state(): SamplingState {
    return { engine: this.engine.state(), realtimeNs: this.lastRealtimeNs };
  }

  /** Restores a new engine and the live VMs; nothing is sampled until resume(), after the owner's own restore. */
  restore(s: SamplingState): void {
    if (this.closed) throw new Error('the sampling service is closed');
    this.engine.restore(s.engine);
    this.pidSet = null;
    this.lastRealtimeNs = s.realtimeNs;
    for (const vm of s.engine.vms) if (vm.phase !== 'ended') this.live.set(vm.id, vm.pid);
  }

  /** After the restores (or a hold): a baseline sample at once when the loop should run and is idle (after a restore, closing the gap). */
  resume(): void {
    if (this.closed) return;
    if (this.shouldRun() && !this.loop.running) this.loop.start({ immediate: true });
  }

  close(): void {
    this.closed = true;
    this.loop.stop();
  }

  /** A tick without an owner's interval: the sample, the engine, the trace. */
  private alone(t: TickInfo): void {
    if (!this.begin()) return;
    settled(this.take(t), (s) => {
      if (s !== undefined && this.attribute(s) !== null) this.trace(s);
      this.end();
    });
  }

  /** An interval's first step: false when there is none (closed, or the previous interval still works in slices: skipped, counted). */
  begin(): boolean {
    if (this.closed) return false;
    if (this.inTick) {
      this.stats.skippedTicks++;
      return false;
    }
    this.inTick = true;
    this.began = monotonicNs();
    return true;
  }

  /** The sample of tick `t`, in slices when the sampler can (a promise then, which never rejects); undefined when none or failed. */
  take(t: TickInfo): Sample | undefined | Promise<Sample | undefined> {
    // Closed or gone idle while the interval's scan ran: no sample (what a tick of a stopped loop does).
    if (this.closed || !this.loop.running) return undefined;
    this.stats.lastLatenessNs = t.latenessNs;
    this.stats.skippedTicks += t.skipped;
    this.sliceStartNs = this.clock();
    return runInSlices(
      this.o.sampler.sampleSteps(() => this.activePidSet()),
      () => {},
      { stopped: () => this.closed },
    )
      .catch((e: unknown) => this.fail(e))
      .finally(() => (this.sliceStartNs = null));
  }

  /** An interval's last step: its duration, and the loop stopped when nothing keeps it running. */
  end(): void {
    this.inTick = false;
    this.stats.lastDurationNs = monotonicNs() - this.began;
    // A tick is pending only while the loop should run: unregister(), hold() and this stop it.
    if (!this.closed && !this.shouldRun()) this.loop.stop();
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

  /** The sample into the engine (its attribution): what it brought, or null when there is none (closed, or the engine refused it: fail()). */
  attribute(s: Sample): SampleEvent | null {
    if (this.closed) return null;
    let result: IntervalResult | null;
    try {
      result = this.engine.addSample(s);
    } catch (e) {
      return this.fail(e) ?? null;
    }
    // The engine may have ended VMs: their pids leave the set.
    this.pidSet = null;
    this.lastRealtimeNs = realtimeNs();
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
    return { tNs: s.tNs, result, ended };
  }

  trace(s: Sample): void {
    this.traced(() => this.o.trace?.sample(s));
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

  /** The sample failed (the energy source, the engine, or the owner's refine before it): counted, and said once per outage (see failed). */
  fail(e: unknown): undefined {
    this.stats.failures++;
    if (this.failure) return;
    this.failure = e instanceof Error ? e : new Error(String(e));
    this.o.log.error({ err: this.failure.message }, 'sampling failed; v2 clients get ERROR 5 until it recovers');
  }
}
