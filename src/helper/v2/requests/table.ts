/** The v2 requests and their handlers (docs/protocol.md, docs/protocol-v2.md), and the dispatch of a request to its handler. */
import { T } from '../../../protocol/v2/codec.js';
import type { ClientRequest } from '../../../protocol/v2/messages.js';
import type { Reply } from '../reply.js';
import type { Handler, HandlerTable, RequestType } from './handler.js';
import { hostSubscribe } from './host-subscribe.js';
import { limit } from './power-limit.js';
import { list } from './list.js';
import { observe } from './observe.js';
import { read } from './read.js';
import { register } from './register.js';
import { statsFd } from './stats-fd.js';
import { subscribe } from './subscribe.js';
import { unobserve } from './unobserve.js';
import { unregister } from './unregister.js';

export const HANDLERS: HandlerTable = {
  [T.REGISTER]: register,
  [T.READ]: read,
  [T.SUBSCRIBE]: subscribe,
  [T.UNREGISTER]: unregister,
  [T.LIST]: list,
  [T.OBSERVE]: observe,
  [T.UNOBSERVE]: unobserve,
  [T.HOST_SUBSCRIBE]: hostSubscribe,
  [T.STATS_FD]: statsFd,
  [T.LIMIT]: limit,
};

export function dispatch<C, P>(table: HandlerTable<C, P>, req: ClientRequest, conn: C, parts: P): Reply {
  // The table is keyed by type, so the handler found takes exactly this request.
  const handler = table[req.type] as Handler<RequestType, C, P>;
  return handler(req as never, conn, parts);
}
