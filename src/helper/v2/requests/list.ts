/** LIST: the VMs this connection may see, from an id on. */
import { type T, encodeVmList, type VmEntry } from '../../../protocol/v2/codec.js';
import { frameReply } from '../reply.js';
import type { VmRecord } from '../vm-registry.js';
import type { Handler } from './handler.js';

export const list: Handler<typeof T.LIST> = (req, conn, p) => {
  const entryOf = (r: VmRecord): VmEntry => ({
    hostVmId: r.vmId,
    pid: r.pid,
    uid: r.uid,
    nvpkg: p.sampling.engine.nvpkg(r.vmId),
    starttime: BigInt(r.starttime),
    ended: !r.live,
    discovered: r.owner === null,
    wholeVmOnly: r.wholeVmOnly,
    notWhole: r.notWhole === true,
    guestExact: p.guest?.(r.vmId) !== undefined,
    name: r.name,
    uuid: r.uuid,
  });
  return frameReply(encodeVmList(p.registry.visible(p.clients.viewerOf(conn), Math.max(1, req.fromId)).map(entryOf)));
};
