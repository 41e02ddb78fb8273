/** The v2 requests' handlers (docs/protocol.md, docs/protocol-v2.md; STATS_FD and LIMIT in files of their own), and the dispatch. */
import { E, T, encodeHostUpdate, encodeU32Frame, encodeRegistered, encodeValue, encodeVmList } from '../../../protocol/v2/codec.js';
import type { ClientRequest } from '../../../protocol/v2/messages.js';
import { cannot } from '../../../common/errors.js';
import { unwatch, watch } from '../clients.js';
import { refusal, type Reply } from '../reply.js';
import { currentUpdate } from '../vm-update-frame.js';
import type { RefusalReason } from '../vm-registry.js';
import type { Handler, HandlerTable, RequestType } from './handler.js';
import { limit } from './power-limit.js';
import { observerGroupAdvice, statsFd } from './stats-fd.js';

/** The wire code of each registry refusal (docs/protocol-v2.md, REGISTER). */
const REFUSAL_CODE: Readonly<Record<RefusalReason, number>> = {
  limit: E.LIMIT,
  'not-permitted': E.NOT_PERMITTED,
  'process-gone': E.PROCESS_GONE,
};

/** REGISTER: the registry's admission, then a new VM in the loop or the discovered VM of the same process. */
const register: Handler<typeof T.REGISTER> = (req, conn, p) => {
  const a = p.registry.admit(conn.id, conn.peer, req);
  if (!a.ok) return refusal(REFUSAL_CODE[a.error.reason], T.REGISTER, a.error.message);
  const { spec, uid, attachTo } = a.value;
  let vmId: number;
  if (attachTo !== undefined) {
    // The discovered VM of this very process: one VM, its energy goes on; the client's vCPU list now stands.
    vmId = attachTo;
    p.sampling.engine.updateVcpus(vmId, spec.vcpus);
  } else {
    try {
      p.openPid?.(spec.pid);
    } catch (e) {
      p.forgetPid?.(spec.pid);
      return refusal(E.LIMIT, T.REGISTER, cannot(`register process ${spec.pid}`, (e as Error).message));
    }
    vmId = p.sampling.register(spec);
  }
  p.registry.add(conn.id, vmId, spec, uid);
  p.lifecycle.changed = true;
  conn.log.info({ vmId, pid: spec.pid, vcpus: spec.vcpus.length, wasDiscovered: attachTo !== undefined }, 'v2 VM registered');
  return { frame: encodeRegistered(vmId, p.sampling.engine.nvpkg(vmId), p.sampling.engine.guestPowerUnit) };
};

export const HANDLERS: HandlerTable = {
  [T.REGISTER]: register,
  // READ: one virtual package of a VM this connection registered.
  [T.READ]: (req, conn, p) => {
    if (p.registry.get(req.vmId)?.owner !== conn.id) return refusal(E.NO_SUCH, T.READ, `no VM ${req.vmId} on this connection`);
    const out = p.sampling.engine.output(req.vmId);
    const v = out?.vpkgs[req.vpkg];
    if (!out || !v)
      return refusal(E.NO_SUCH, T.READ, `VM ${req.vmId} has no virtual package ${req.vpkg} (it has ${out?.vpkgs.length ?? 0})`);
    const failed = p.sampling.failed;
    if (failed && !out.ended) return refusal(E.ENERGY_SOURCE, T.READ, `sampling failed: ${failed.message}`);
    return { frame: encodeValue(req.vmId, req.vpkg, { counter: BigInt(v.counter), energyUj: v.energyUj }, out.tNs, out.ended) };
  },
  // SUBSCRIBE: an UPDATE now (the acknowledgment; an ended VM gets only this one), then one per sample, of a VM this connection registered.
  [T.SUBSCRIBE]: (req, conn, p) => {
    if (p.registry.get(req.vmId)?.owner !== conn.id) return refusal(E.NO_SUCH, T.SUBSCRIBE, `no VM ${req.vmId} on this connection`);
    const u = currentUpdate(p.sampling.engine, req.vmId);
    if (!u) return refusal(E.NO_SUCH, T.SUBSCRIBE, `no VM ${req.vmId}`);
    if (!u.ended) watch(conn, req.vmId, req.domains);
    return { frame: u.frame(req.domains) };
  },
  // UNREGISTER: the connection lets go of a VM it registered (VmLifecycle.release).
  [T.UNREGISTER]: (req, conn, p) => {
    if (p.registry.get(req.vmId)?.owner !== conn.id) return refusal(E.NO_SUCH, T.UNREGISTER, `no VM ${req.vmId} on this connection`);
    unwatch(conn, req.vmId);
    p.lifecycle.release(req.vmId);
    conn.log.info({ vmId: req.vmId }, 'v2 VM unregistered');
    return { frame: encodeU32Frame(T.OK, req.vmId) };
  },
  // LIST: the VMs this connection may see, from an id on.
  [T.LIST]: (req, conn, p) => {
    const vms = p.registry.visible(p.clients.viewerOf(conn), Math.max(1, req.fromId));
    const entries = vms.map((r) => ({
      ...r,
      hostVmId: r.vmId,
      nvpkg: p.sampling.engine.nvpkg(r.vmId),
      starttime: BigInt(r.starttime),
      ended: !r.live,
      // Discovered only: nobody registered it (a registered VM discovery found too is not).
      discovered: r.owner === null,
      notWhole: r.notWhole === true,
      guestExact: p.guest?.(r.vmId) !== undefined,
    }));
    return { frame: encodeVmList(entries) };
  },
  // OBSERVE: SUBSCRIBE to any VM the connection may see, registered by anyone or discovered.
  [T.OBSERVE]: (req, conn, p) => {
    // A VM the peer may not see is answered exactly like one that does not exist.
    const u = p.registry.canSee(p.clients.viewerOf(conn), req.vmId) ? currentUpdate(p.sampling.engine, req.vmId) : null;
    if (!u) return refusal(E.NO_SUCH, T.OBSERVE, `no VM ${req.vmId}`);
    if (!u.ended) watch(conn, req.vmId, req.domains);
    return { frame: u.frame(req.domains) };
  },
  // UNOBSERVE: no more UPDATEs of the VM (answered OK whether watched or not).
  [T.UNOBSERVE]: (req, conn) => {
    unwatch(conn, req.vmId);
    return { frame: encodeU32Frame(T.OK, req.vmId) };
  },
  // HOST_SUBSCRIBE: the host's energy each sample, for root and the observer group; a second one replaces the first's layout.
  [T.HOST_SUBSCRIBE]: (req, conn, p) => {
    if (!p.clients.viewerOf(conn).seesAll) {
      const how = observerGroupAdvice(p.observerGid);
      return refusal(E.NOT_PERMITTED, T.HOST_SUBSCRIBE, `host energy is for root and the observer group; ${how}`);
    }
    p.clients.subscribeHost(conn, req.perPackage, req.domains);
    return { frame: encodeHostUpdate(p.hostValues(req.perPackage, req.domains)) };
  },
  [T.STATS_FD]: statsFd,
  [T.LIMIT]: limit,
};

export function dispatch<C, P>(table: HandlerTable<C, P>, req: ClientRequest, conn: C, parts: P): Reply {
  // The table is keyed by type, so the handler found takes exactly this request.
  const handler = table[req.type] as Handler<RequestType, C, P>;
  return handler(req as never, conn, parts);
}
