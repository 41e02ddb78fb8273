/**
 * LIMIT: a VM's power limit read (anyone who may see the VM), or set and removed (flag LIMIT_SET: root
 * and the socket's group only; observers are refused, ERROR 2), on the package or a domain the request
 * names (one the helper does not attribute: ERROR 3). docs/power-limits.md.
 */
import { E, T, encodeLimitState } from '../../../protocol/v2/codec.js';
import { refusal } from '../reply.js';
import { cannot } from '../../../common/errors.js';
import type { Handler } from './handler.js';

export const limit: Handler<typeof T.LIMIT> = (req, conn, p) => {
  const refuse = (code: number, message: string) => refusal(code, T.LIMIT, message);
  const limits = p.limits;
  if (limits === undefined) return refuse(E.NOT_PERMITTED, 'this helper runs without power limits');
  const vm = p.registry.get(req.vmId);
  if (vm === undefined || !p.registry.canSee(p.clients.viewerOf(conn), req.vmId)) return refuse(E.NO_SUCH, `no VM ${req.vmId}`);
  const domain = req.domain ?? 'package';
  const domainProblem = limits.limiter.domainProblem(domain);
  if (domainProblem !== null) return refuse(E.NO_SUCH, cannot(`limit the ${domain} power of VM ${req.vmId}`, domainProblem));
  if (req.milliwatts !== null) {
    if (!limits.mayLimit(conn.peer))
      return refuse(E.NOT_PERMITTED, "power limits are set by root and the helper's --socket-group; ask an administrator");
    if (req.milliwatts !== 0 && p.sampling.engine.output(req.vmId)?.ended !== false)
      return refuse(E.PROCESS_GONE, `VM ${req.vmId} has ended`);
    const why = limits.limiter.set(req.vmId, vm.pid, req.milliwatts === 0 ? null : req.milliwatts / 1000, false, domain);
    if (why !== null) return refuse(E.LIMIT, why);
  }
  const v = limits.limiter.view(req.vmId, domain);
  return {
    frame: encodeLimitState({
      vmId: req.vmId,
      limitMw: v === undefined ? 0 : Math.round(v.limitW * 1000),
      quotaUs: v?.quotaUs ?? 0,
      periodUs: v?.periodUs ?? 0,
      limitedNs: BigInt(Math.round((v?.limitedS ?? 0) * 1e9)),
      ...(req.domain !== undefined ? { domain } : {}),
    }),
  };
};
