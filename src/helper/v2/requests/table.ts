/** The v2 requests and their handlers (docs/protocol.md, docs/protocol-v2.md). */
import { T } from '../../../protocol/v2/codec.js';
import type { HandlerTable } from './handler.js';
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
