/** UNREGISTER: the connection lets go of a VM it registered (VmLifecycle.release). */
import { E, T, encodeError, encodeOk } from '../../../protocol/v2/codec.js';
import { unwatch } from '../clients.js';
import { frameReply } from '../reply.js';
import type { Handler } from './handler.js';

export const unregister: Handler<typeof T.UNREGISTER> = (req, conn, p) => {
  if (!p.registry.owns(conn.id, req.vmId)) return frameReply(encodeError(E.NO_SUCH, T.UNREGISTER, `no VM ${req.vmId} on this connection`));
  unwatch(conn, req.vmId);
  p.lifecycle.release(req.vmId);
  conn.log.info({ vmId: req.vmId }, 'v2 VM unregistered');
  return frameReply(encodeOk(req.vmId));
};
