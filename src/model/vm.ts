/** A VM as the engine is given it (pid, starttime, vCPUs), and the most VMs anything holds. Pure data. */
import type { VcpuSpec } from './vcpus.js';

/** The most VMs anything holds (a replay's trace may register without end; --max-vms; a snapshot); the daemon's caps are far below. */
export const MAX_VMS = 100_000;

export interface VmSpec {
  pid: number;
  /** Field 22 of /proc/<pid>/stat at registration; a different value later means the pid was reused. */
  starttime: number;
  name?: string;
  vcpus: VcpuSpec[];
}
