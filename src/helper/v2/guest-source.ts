/**
 * What the guest directories (src/guest-dir/, docs/guest.md) read of the v2 service: every VM known
 * (registered or discovered) with its UUID, name and owner, and its statistics written
 * into the guest's file.
 */
import type { GuestDirSource } from '../../guest-dir/guest-dirs.js';
import type { StatsFiles } from './stats-files.js';
import type { FdAdmitter, VmRegistry } from './vm-registry.js';
import { peerInGroup } from '../../os/peer.js';

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
