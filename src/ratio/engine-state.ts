/**
 * The ratio engine's whole state as plain data (RatioEngine.state() and restore()): what a restart
 * carries so that the first interval after it spans the gap from the last sample the old process took
 * and attributes it as if no restart happened (docs/ratio.md, "Restart"). Pure data, no I/O.
 */
import type { VcpuSpec } from '../model/vcpus.js';

/** pending: registered since the last sample (the next one is its baseline); active; ended: frozen. */
type EnginePhase = 'pending' | 'active' | 'ended';

/** What the last sample said about one thread of an active VM: (tid, starttime) is its identity. */
interface ThreadMarkState {
  tid: number;
  starttime: number;
  /** utime + stime, ticks. */
  ticks: number;
}

export interface EngineVmState {
  /** The engine's id of the registration (the v2 host VM id). */
  id: number;
  pid: number;
  starttime: number;
  name?: string;
  vcpus: VcpuSpec[];
  phase: EnginePhase;
  /** Set when phase is 'ended'. */
  endedBy?: 'exit' | 'unregister';
  /** A(v,g) in joules, index = virtual package; its length is the VM's nvpkg. */
  accJ: number[];
  /** The same for each other RAPL domain the engine attributes (absent: only the package). */
  domainAccJ?: { domain: string; accJ: number[] }[];
  /** Sample time of the published values; 0n before the first interval. */
  tNs: bigint;
  /** The threads of the last sample (active VMs only; empty otherwise). */
  prev: ThreadMarkState[];
}

interface EngineSampleState {
  tNs: bigint;
  /** Bits 31:0 of R_p per package the last sample had (a package missing there has no entry). */
  energy: { pkg: number; raw: number }[];
  /** Each other domain's counter (mod its range) as last read, per package (absent: only the package). */
  domains?: { domain: string; pkg: number; raw: number }[];
}

export interface EngineState {
  /** The id the next register() gives: above every VM's id. */
  nextId: number;
  /** The last sample, null before the first. */
  lastSample: EngineSampleState | null;
  vms: EngineVmState[];
}
