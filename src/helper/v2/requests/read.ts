/** READ: one virtual package of a VM this connection registered. */
import { E, T, encodeError, encodeValue } from '../../../protocol/v2/codec.js';
import { frameReply } from '../reply.js';
import type { Handler } from './handler.js';

export const read: Handler<typeof T.READ> = (req, conn, p) => {
  const no = (message: string) => frameReply(encodeError(E.NO_SUCH, T.READ, message));
  if (!p.registry.owns(conn.id, req.vmId)) return no(`no VM ${req.vmId} on this connection`);
  const out = p.sampling.engine.output(req.vmId);
  const v = out?.vpkgs[req.vpkg];
  if (!out || !v) return no(`VM ${req.vmId} has no virtual package ${req.vpkg} (it has ${out?.vpkgs.length ?? 0})`);
  const failed = p.sampling.failed;
  if (failed && !out.ended) return frameReply(encodeError(E.ENERGY_SOURCE, T.READ, `sampling failed: ${failed.message}`));
  return frameReply(encodeValue(req.vmId, req.vpkg, { counter: BigInt(v.counter), energyUj: v.energyUj }, out.tNs, out.ended));
};
