/** A VM as the engine is given it (pid, starttime, vCPUs), and the most VMs anything holds. Pure data. */
import type { VcpuSpec } from './vcpus.js';

/**
 * The most VMs anything holds at once, whatever it is given: a replay (a trace may register VMs without
 * end), the exporter's --max-vms, a restart snapshot. The daemon's own caps are far below it:
 * DEFAULT_MAX_DISCOVERED_VMS (discovery) and DEFAULT_V2_LIMITS.maxVms (registrations).
 */
export const MAX_VMS = 100_000;

export interface VmSpec {
  pid: number;
  /** Field 22 of /proc/<pid>/stat at registration; a different value later means the pid was reused. */
  starttime: number;
  name?: string;
  vcpus: VcpuSpec[];
}
