/** REGISTER: the registry's admission, then a new VM in the loop or the discovered VM of the same process. */
import { E, T, encodeError, encodeRegistered } from '../../../protocol/v2/codec.js';
import { cannot } from '../../../common/errors.js';
import { frameReply } from '../reply.js';
import type { RefusalReason } from '../vm-registry.js';
import type { Handler } from './handler.js';

/** The wire code of each registry refusal (docs/protocol-v2.md, REGISTER). */
const REFUSAL_CODE: Readonly<Record<RefusalReason, number>> = {
  limit: E.LIMIT,
  'not-permitted': E.NOT_PERMITTED,
  'process-gone': E.PROCESS_GONE,
};

export const register: Handler<typeof T.REGISTER> = (req, conn, p) => {
  const a = p.registry.admit(conn.id, conn.peer, req);
  if (!a.ok) return frameReply(encodeError(REFUSAL_CODE[a.error.reason], T.REGISTER, a.error.message));
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
      return frameReply(encodeError(E.LIMIT, T.REGISTER, cannot(`register process ${spec.pid}`, (e as Error).message)));
    }
    vmId = p.sampling.register(spec);
  }
  p.registry.add(conn.id, vmId, spec, uid);
  p.lifecycle.markChanged();
  conn.log.info({ vmId, pid: spec.pid, vcpus: spec.vcpus.length, wasDiscovered: attachTo !== undefined }, 'v2 VM registered');
  return frameReply(encodeRegistered(vmId, p.sampling.engine.nvpkg(vmId), p.sampling.engine.guestPowerUnit));
};
