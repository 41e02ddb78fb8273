/** The v2 service's limits, in a module of their own: the command line reads them without loading the service. */
import { MAX_VCPUS } from '../../model/vcpus.js';

export interface V2Limits {
  /** VMs registered by one connection at once. */
  maxVmsPerConnection: number;
  /** vCPUs in one REGISTER (at most 4096, the protocol's own bound). */
  maxVcpus: number;
  /** VMs registered on the whole service at once. */
  maxVms: number;
  /** Bytes queued to one client that it has not read; past it the client is disconnected. */
  maxBacklogBytes: number;
}

export const DEFAULT_V2_LIMITS: V2Limits = {
  maxVmsPerConnection: 64,
  maxVcpus: MAX_VCPUS,
  maxVms: 1024,
  maxBacklogBytes: 256 * 1024,
};
