/** A v2 request handler: (request, connection, the service's parts) -> reply. A new request = a handler, its table.ts entry, its codec. */
import type { ClientRequest } from '../../../protocol/v2/messages.js';
import type { HostValues } from '../../../protocol/v2/codec.js';
import type { SamplingService } from '../../../sampling/sampling-service.js';
import type { Clients } from '../clients.js';
import type { V2Connection } from '../connection.js';
import type { Reply } from '../reply.js';
import type { VmLifecycle } from '../vm-lifecycle.js';
import type { VmRegistry } from '../vm-registry.js';
import type { StatsFiles } from '../stats-files.js';
import type { PowerLimiter } from '../../../power-limit/limiter.js';
import type { PeerCredentials } from '../../../os/libc/sockets.js';

export type RequestType = ClientRequest['type'];

type RequestOf<K extends RequestType> = Extract<ClientRequest, { type: K }>;

export interface RequestParts {
  registry: VmRegistry;
  sampling: Pick<SamplingService, 'register' | 'engine' | 'failed'>;
  lifecycle: VmLifecycle;
  clients: Clients<V2Connection>;
  /** HOST_UPDATE's values now, VMs changed or not (HOST_SUBSCRIBE's acknowledgment says not). */
  hostValues(perPackage: boolean, domains?: boolean): HostValues;
  /** Opens what sampling the pid needs (V2ServiceOptions.openPid); throws when it cannot. */
  openPid?: (pid: number) => void;
  /** Drops what was opened for the pid (V2ServiceOptions.forgetPid). */
  forgetPid?: (pid: number) => void;
  stats: StatsFiles;
  /** --observer-group, for the advice of a refused HOST_SUBSCRIBE. */
  observerGid?: number;
  /** --guest-energy exact: a VM's guest energy, undefined while it is not exact (LIST's GUEST_EXACT). */
  guest?: (vmId: number) => unknown;
  /** The power limits (LIMIT), and who may set them; absent: the service runs without. */
  limits?: { limiter: PowerLimiter; mayLimit(peer: PeerCredentials): boolean };
}

export type Handler<K extends RequestType, C = V2Connection, P = RequestParts> = (req: RequestOf<K>, conn: C, parts: P) => Reply;

/** One handler per request type: a type without one does not compile. */
export type HandlerTable<C = V2Connection, P = RequestParts> = { readonly [K in RequestType]: Handler<K, C, P> };
