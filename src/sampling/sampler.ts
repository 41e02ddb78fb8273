/** One sample S(i): package energy first, then the stat lines of every registered VM's threads. */
import { domainReadings, EnergyReadError, packageCounters, type EnergyReading, type EnergySource } from '../energy/energy-source.js';
import { TaskReadError, type ProcTaskReader } from '../os/proc-tasks.js';
import type { Sample } from '../model/sample.js';
import { monotonicNs } from './tick-loop.js';

export class Sampler {
  constructor(
    private readonly energy: EnergySource,
    private readonly tasks: ProcTaskReader,
    private readonly clock: () => bigint = monotonicNs,
    /** Told of each read where only domains other than the package failed (the sample goes on without them). */
    private readonly onDomainFailure?: (e: EnergyReadError) => void,
    /** Told of each process whose threads could not be read at all (the sample goes on without it). */
    private readonly onTaskFailure?: (pid: number, e: TaskReadError) => void,
  ) {}

  /**
   * The time is taken right before the energy read (counters move continuously, ticks at tick boundaries). Throws
   * EnergyReadError when the package cannot be read. A process gone or never read (TaskReadError) is absent: its end.
   */
  sample(pids: Iterable<number>): Sample {
    const wanted = new Set(pids);
    const steps = this.sampleSteps(() => wanted);
    for (;;) {
      const r = steps.next();
      if (r.done === true) return r.value;
    }
  }

  /** One VM per step (time-slices.ts), `pids()` asked before each: one registered meanwhile is read at the end, never taken as ended. */
  *sampleSteps(pids: () => ReadonlySet<number>): Generator<null, Sample, undefined> {
    const tNs = this.clock();
    let readings: readonly EnergyReading[];
    try {
      readings = this.energy.read();
    } catch (e) {
      if (!(e instanceof EnergyReadError) || e.readings === undefined) throw e;
      readings = e.readings;
      this.onDomainFailure?.(e);
    }
    const energy = packageCounters(readings);
    const tasks = new Map<number, Map<number, string>>();
    const read = (pid: number) => {
      let lines: Map<number, string> | null;
      try {
        lines = this.tasks.read(pid);
      } catch (e) {
        if (!(e instanceof TaskReadError)) throw e;
        this.onTaskFailure?.(pid, e);
        return;
      }
      if (lines !== null) tasks.set(pid, lines);
    };
    const done = new Set<number>();
    for (const pid of [...pids()]) {
      if (!pids().has(pid)) continue;
      done.add(pid);
      read(pid);
      yield null;
    }
    for (const pid of pids()) if (!done.has(pid)) read(pid);
    const s: Sample = { tNs, energy, tasks };
    if (this.energy.domainCounters.length > 0) s.domains = domainReadings(readings);
    return s;
  }
}
