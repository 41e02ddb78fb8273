/** Hands a parsed request to the handler of its type. */
import type { ClientRequest } from '../../../protocol/v2/messages.js';
import type { Reply } from '../reply.js';
import type { Handler, HandlerTable, RequestType } from './handler.js';

export function dispatch<C, P>(table: HandlerTable<C, P>, req: ClientRequest, conn: C, parts: P): Reply {
  // The table is keyed by type, so the handler found takes exactly this request.
  const handler = table[req.type] as Handler<RequestType, C, P>;
  return handler(req as never, conn, parts);
}
