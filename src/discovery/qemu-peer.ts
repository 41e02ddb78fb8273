/** Whether a connection's peer is a QEMU of the socket's group, served first (docs/security.md, "The socket's group locking QEMU out"). */
import path from 'node:path';
import { isQemuName } from './names.js';
import { readProcFileOr } from '../os/proc-file.js';
import { isPreferredPeer } from '../budget/preferred-owner.js';

/** Whether `peer` is a QEMU process of root or of one of `groups` (false when it is gone). */
export function isQemuPeer(procRoot: string, peer: { pid: number; uid: number; gid: number }, groups: readonly number[]): boolean {
  if (peer.pid <= 0 || !isPreferredPeer(procRoot, peer, groups)) return false;
  const comm = readProcFileOr(path.join(procRoot, String(peer.pid), 'comm'), 'utf8');
  return comm !== null && isQemuName(comm.trimEnd());
}
