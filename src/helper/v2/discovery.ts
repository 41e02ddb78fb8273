/** What the v2 service needs from discovery (ProcScanner implements it). */
import type { DiscoveredVm, KnownProcessState } from '../../discovery/scanner.js';
import type { VcpuSpec } from '../../model/vcpus.js';

export interface Discovery {
  /** VM processes tracked now, and the most it tracks (--max-discovered-vms): the host statistics file states both. */
  readonly trackedVms: number;
  readonly maxVms: number;
  /** The VM processes that appeared since the last scan, one pid per step (a VM found, or null), to be run in slices. */
  scanSteps(): Iterator<DiscoveredVm | null>;
  /** New vCPU list of a discovered VM from this sample's stat lines, null when unchanged. */
  refine(pid: number, lines: ReadonlyMap<number, string>): { vcpus: VcpuSpec[]; wholeVmOnly: boolean } | null;
  /** The VM of this pid ended or was dropped: examine the pid afresh. */
  forget(pid: number): void;
  /** The vCPU list as last classified (a registrant let go of a discovered VM). */
  current(pid: number): { vcpus: VcpuSpec[]; wholeVmOnly: boolean } | null;
  /** A VM scan() returned that was not admitted: try it again later. */
  defer(pid: number): void;
  /** Processes looked at and found not to be VMs (what a restart carries), and their restore before the first scan. */
  state(): KnownProcessState[];
  restore(known: readonly KnownProcessState[]): void;
  /** A discovered VM a restart hands back: tracked again; false when the process is gone or is not a VM now. */
  adopt(pid: number, starttime: number): boolean;
}
