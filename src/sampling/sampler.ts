/** One sample S(i): package energy first, then the stat lines of every registered VM's threads. */
import { packageCounters, type EnergySource } from '../energy/energy-source.js';
import type { ProcTaskReader } from '../os/proc-tasks.js';
import type { Sample } from '../ratio/types.js';
import { monotonicNs } from './tick-loop.js';

export class Sampler {
  constructor(
    private readonly energy: EnergySource,
    private readonly tasks: ProcTaskReader,
    private readonly clock: () => bigint = monotonicNs,
  ) {}

  /**
   * The timestamp is taken once, right before the energy read: the counters are the time-critical part
   * (they move continuously), while tick counts only change at tick boundaries. A pid whose process is
   * gone is absent from `tasks`. The sample keeps each package's counter as read (what the engine and
   * traces work on). Throws when the energy source fails (EnergyReadError), or a /proc read fails for a
   * reason other than the process being gone (TaskReadError, e.g. EMFILE): the sample is skipped.
   */
  sample(pids: Iterable<number>): Sample {
    const tNs = this.clock();
    const energy = packageCounters(this.energy.read());
    const tasks = new Map<number, Map<number, string>>();
    for (const pid of pids) {
      if (tasks.has(pid)) continue;
      const lines = this.tasks.read(pid);
      if (lines !== null) tasks.set(pid, lines);
    }
    return { tNs, energy, tasks };
  }
}
