/** A live VM as guest energy needs it: found by its process, with its vCPUs and attributed energy. */
import type { SamplingService } from '../../sampling/sampling-service.js';
import type { VmRegistry } from '../v2/vm-registry.js';
import type { GuestVmView } from './guest-energy.js';

/** The live, sampled VM whose process is `pid` (the first registered if several), or undefined. */
export function guestVmOf(registry: VmRegistry, sampling: SamplingService, pid: number): GuestVmView | undefined {
  for (const r of registry.all()) {
    if (r.pid !== pid || !r.live) continue;
    const out = sampling.output(r.vmId);
    const threads = sampling.threadTotals(r.vmId);
    if (out === undefined || out.ended || threads === undefined) continue;
    let exactJ = 0;
    for (const v of out.vpkgs) exactJ += v.energyJ;
    return {
      vmId: r.vmId,
      pid,
      starttime: r.starttime,
      vcpus: new Map(threads.vcpus.map((v) => [v.tid, v.vpkg])),
      nvpkg: out.vpkgs.length,
      exactJ,
      vpkgJ: out.vpkgs.map((v) => v.energyJ),
    };
  }
  return undefined;
}
