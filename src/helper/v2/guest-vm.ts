/** What the guest side reads of the v2 service: a live VM for guest energy, and every VM for the guest directories. */
import type { GuestDirSource } from '../../guest-dir/guest-dirs.js';
import { peerInGroup } from '../../os/peer.js';
import type { StatsFiles } from './stats-files.js';
import type { SamplingService } from '../../sampling/sampling-service.js';
import type { FdAdmitter, VmRecord, VmRegistry } from './vm-registry.js';
import type { GuestVmView } from '../guest/guest-energy.js';

/** The view of a registered VM, or undefined when it is not live, not sampled yet, or ended. */
function viewOf(r: VmRecord, sampling: SamplingService): GuestVmView | undefined {
  if (!r.live) return undefined;
  const out = sampling.engine.output(r.vmId);
  const threads = sampling.engine.threadTotals?.(r.vmId);
  if (out === undefined || out.ended || threads === undefined) return undefined;
  let exactJ = 0;
  for (const v of out.vpkgs) exactJ += v.energyJ;
  return {
    vmId: r.vmId,
    pid: r.pid,
    starttime: r.starttime,
    vcpus: new Map(threads.vcpus.map((v) => [v.tid, v.vpkg])),
    nvpkg: out.vpkgs.length,
    exactJ,
    vpkgJ: out.vpkgs.map((v) => v.energyJ),
  };
}

/** The live, sampled VM of each of `pids` (the first registered if several), in one walk of the registry. */
export function guestVmsOf(registry: VmRegistry, sampling: SamplingService, pids: ReadonlySet<number>): Map<number, GuestVmView> {
  const out = new Map<number, GuestVmView>();
  for (const r of registry.all()) {
    if (!pids.has(r.pid) || out.has(r.pid)) continue;
    const v = viewOf(r, sampling);
    if (v !== undefined) out.set(r.pid, v);
  }
  return out;
}

interface GuestSourceParts {
  registry: Pick<VmRegistry, 'all'>;
  stats: Pick<StatsFiles, 'copy'>;
  fds?: FdAdmitter;
  procRoot: string;
  /** --observer-group: its members see every VM. */
  observerGid?: number;
}

export function guestSource(p: GuestSourceParts): GuestDirSource {
  return {
    vms: () => p.registry.all(),
    statsCopy: (vmId, map) => p.stats.copy(vmId, map),
    canOpen: (n, what) => p.fds?.canOpen?.(n, what).ok ?? true,
    inGroup: (vm, gid) => peerInGroup(p.procRoot, { pid: vm.pid, uid: vm.uid, gid: -1 }, gid),
    // Who may see a VM (VmRegistry.canSee: root, the observer group, the VM's uid) as a file's readers.
    readers: (uid) => ({ uid, gid: p.observerGid ?? null }),
  };
}
