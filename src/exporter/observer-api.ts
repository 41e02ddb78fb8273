/**
 * What the exporter needs from a v2 connection: LIST, OBSERVE by host-wide VM id, and the host
 * subscription (docs/protocol-v2.md "Observers"). V2Client has this shape; the exporter receives it
 * behind this interface, so its core is the same whatever carries the frames.
 */
import type { HostUpdate, V2Error, VmInfo, VmUpdate } from '../client/v2-client.js';

export type { HostUpdate, VmInfo, VmUpdate };

export interface ObserverClient {
  list(): Promise<VmInfo[]>;
  observe(hostVmId: number, onUpdate: (u: VmUpdate) => void, onError?: (e: V2Error) => void): Promise<VmUpdate>;
  /** A statistics fd (docs/stats-fd.md) of VM `hostVmId`, or of the host (0); absent for a client without it. */
  statsFd?(hostVmId: number): Promise<{ fd: number; fileSize: number }>;
  subscribeHost(onUpdate: (u: HostUpdate) => void, onError?: (e: V2Error) => void): Promise<HostUpdate>;
  /** Resolves when the connection ends (with the reason when it broke). */
  readonly closed: Promise<Error | null>;
  close(): Promise<void>;
}
