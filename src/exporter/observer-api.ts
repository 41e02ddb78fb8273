/** What the exporter needs from a v2 connection (V2Client has this shape): LIST and the statistics fds. */
import type { HostUpdate, VmInfo, VmUpdate } from '../client/v2-replies.js';

export type { HostUpdate, VmInfo, VmUpdate };

export interface ObserverClient {
  list(): Promise<VmInfo[]>;
  /** A statistics fd (docs/stats-fd.md) of VM `hostVmId`, or of the host (0). */
  statsFd(hostVmId: number): Promise<{ fd: number; fileSize: number }>;
  /** Resolves when the connection ends (with the reason when it broke). */
  readonly closed: Promise<Error | null>;
  close(): Promise<void>;
}
