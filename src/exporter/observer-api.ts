/**
 * What the exporter needs from a v2 connection: LIST, OBSERVE by host-wide VM id, and the host
 * subscription. V2Client has this shape; the exporter receives it behind this interface, so its core
 * runs against the real client in production and tests alike.
 */

export interface VmInfo {
  hostVmId: number;
  pid: number;
  uid: number;
  name: string | null;
  uuid: string | null;
  source: 'registered' | 'discovered';
  nvpkg: number;
  ended: boolean;
  /** vCPU threads could not be told apart: the whole VM is one virtual package. */
  wholeVmOnly: boolean;
}

export interface VmUpdate {
  hostVmId: number;
  tNs: bigint;
  ended: boolean;
  vpkgs: { counter: number | bigint; energyUj: bigint }[];
}

export interface HostUpdate {
  tNs: bigint;
  packages: { pkg: number; energyUj: bigint }[];
  unattributedUj: bigint;
  /** A VM appeared or ended since the last host update: LIST again. */
  vmsChanged: boolean;
  stats?: {
    legacyRequests: { ok: bigint; refused: bigint; failed: bigint };
    connections: number;
    lastSampleDurationNs: bigint;
  };
}

export interface ObserverClient {
  list(): Promise<VmInfo[]>;
  observe(hostVmId: number, onUpdate: (u: VmUpdate) => void, onError?: (e: Error) => void): Promise<VmUpdate>;
  subscribeHost(onUpdate: (u: HostUpdate) => void, onError?: (e: Error) => void): Promise<HostUpdate>;
  /** Resolves when the connection ends (with the reason when it broke). */
  readonly closed: Promise<Error | null>;
  close(): Promise<void>;
}
