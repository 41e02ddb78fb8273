/** OBSERVE: SUBSCRIBE to any VM the connection may see, registered by anyone or discovered. */
import { E, T, encodeError } from '../../../protocol/v2/codec.js';
import { watch } from '../clients.js';
import { frameReply } from '../reply.js';
import { currentUpdate } from '../vm-update-frame.js';
import type { Handler } from './handler.js';

export const observe: Handler<typeof T.OBSERVE> = (req, conn, p) => {
  // A VM the peer may not see is answered exactly like one that does not exist.
  const u = p.registry.canSee(p.clients.viewerOf(conn), req.vmId) ? currentUpdate(p.sampling.engine, req.vmId) : null;
  if (!u) return frameReply(encodeError(E.NO_SUCH, T.OBSERVE, `no VM ${req.vmId}`));
  if (!u.ended) watch(conn, req.vmId, req.domains);
  return frameReply(u.frame(req.domains));
};
