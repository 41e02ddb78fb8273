/** UNOBSERVE: no more UPDATEs of the VM (answered OK whether watched or not). */
import { type T, encodeOk } from '../../../protocol/v2/codec.js';
import { unwatch } from '../clients.js';
import { frameReply } from '../reply.js';
import type { Handler } from './handler.js';

export const unobserve: Handler<typeof T.UNOBSERVE> = (req, conn) => {
  unwatch(conn, req.vmId);
  return frameReply(encodeOk(req.vmId));
};
