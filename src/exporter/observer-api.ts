/**
 * What the exporter needs from a v2 connection: LIST and the statistics fds of the host and of each
 * VM by host-wide VM id (docs/stats-fd.md). V2Client has this shape; the exporter receives it behind
 * this interface, so its core is the same whatever carries the frames.
 */
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
