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
   * The timestamp is taken once, right before the energy read: the counters are the time-critical part
   * (they move continuously), while tick counts only change at tick boundaries. A pid whose process is
   * gone is absent from `tasks`. The sample keeps each package's counter as read (what the engine and
   * traces work on), and every domain's energy when the source reads more than the package. A domain
   * other than the package that fails leaves the sample without it (onDomainFailure is told): the
   * package goes on. Throws when the package energy cannot be read (EnergyReadError): the sample is
   * skipped. One process's /proc failure (TaskReadError, e.g. EMFILE) never stops the others: the
   * reader gives a process read before its lines as last read; one never read is left out of this
   * sample (onTaskFailure is told), which the engine takes as its end.
   */
  sample(pids: Iterable<number>): Sample {
    const wanted = new Set(pids);
    const steps = this.sampleSteps(() => wanted);
    for (;;) {
      const r = steps.next();
      if (r.done === true) return r.value;
    }
  }

  /**
   * The same sample one VM per step, to be run in slices (time-slices.ts) with clients served
   * between them: the energy first, then each pid of `pids()` (asked again before each read: a VM
   * unregistered meanwhile is not read, one registered meanwhile is read at the end, without a
   * step, so the engine never takes a VM for ended because its pid came late). The stat lines are
   * then read up to the slices' duration after the energy, as they are after a long synchronous
   * read: the engine takes each sample's lines as of its energy reading.
   */
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
        // One VM's threads unreadable (EMFILE, ...): that VM is told, the others are read.
        if (!(e instanceof TaskReadError)) throw e;
        this.onTaskFailure?.(pid, e);
        return;
      }
      if (lines !== null) tasks.set(pid, lines);
    };
    const done = new Set<number>();
    for (const pid of [...pids()]) {
      if (done.has(pid) || !pids().has(pid)) continue;
      done.add(pid);
      read(pid);
      yield null;
    }
    for (const pid of pids()) {
      if (done.has(pid)) continue;
      done.add(pid);
      read(pid);
    }
    const s: Sample = { tNs, energy, tasks };
    if (this.energy.domainCounters.length > 0) s.domains = domainReadings(readings);
    return s;
  }
}
