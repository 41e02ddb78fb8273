/** SUBSCRIBE: an UPDATE now (the acknowledgment), then one per sample, of a VM this connection registered. */
import { E, T, encodeError } from '../../../protocol/v2/codec.js';
import { watch } from '../clients.js';
import { frameReply } from '../reply.js';
import { currentUpdate } from '../vm-update-frame.js';
import type { Handler } from './handler.js';

export const subscribe: Handler<typeof T.SUBSCRIBE> = (req, conn, p) => {
  if (!p.registry.owns(conn.id, req.vmId)) return frameReply(encodeError(E.NO_SUCH, T.SUBSCRIBE, `no VM ${req.vmId} on this connection`));
  const u = currentUpdate(p.sampling.engine, req.vmId);
  if (!u) return frameReply(encodeError(E.NO_SUCH, T.SUBSCRIBE, `no VM ${req.vmId}`));
  // The immediate UPDATE is the acknowledgment; an ended VM gets only this one.
  if (!u.ended) watch(conn, req.vmId, req.domains);
  return frameReply(u.frame(req.domains));
};
