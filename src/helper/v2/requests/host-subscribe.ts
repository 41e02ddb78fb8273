/** HOST_SUBSCRIBE: the host's energy each sample, for root and the observer group. */
import { E, T, encodeError, encodeHostUpdate } from '../../../protocol/v2/codec.js';
import { frameReply } from '../reply.js';
import type { Handler } from './handler.js';
import { observerGroupAdvice } from './observer-advice.js';

export const hostSubscribe: Handler<typeof T.HOST_SUBSCRIBE> = (req, conn, p) => {
  if (!p.clients.viewerOf(conn).seesAll) {
    const how = observerGroupAdvice(p.observerGid);
    return frameReply(encodeError(E.NOT_PERMITTED, T.HOST_SUBSCRIBE, `host energy is for root and the observer group; ${how}`));
  }
  // A second HOST_SUBSCRIBE on the connection replaces the first's choice of layout.
  p.clients.subscribeHost(conn, req.perPackage, req.domains);
  return frameReply(encodeHostUpdate(p.hostValues(req.perPackage, req.domains)));
};
