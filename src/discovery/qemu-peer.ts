/**
 * Whether the process on the other end of a connection is a QEMU of the socket's group, served first
 * whoever holds the slots (docs/security.md, "The socket's group locking QEMU out"). A member of the
 * group may name a process so; each such process still gets only one connection first in line
 * (connection-seats.ts).
 */
import path from 'node:path';
import { isQemuName } from './names.js';
import { readProcFile } from '../os/proc-file.js';
import { isPreferredPeer } from '../budget/preferred-owner.js';

/** Whether `peer` is a QEMU process of root or of one of `groups` (false when it is gone). */
export function isQemuPeer(procRoot: string, peer: { pid: number; uid: number; gid: number }, groups: readonly number[]): boolean {
  if (peer.pid <= 0 || !isPreferredPeer(procRoot, peer, groups)) return false;
  let comm: string;
  try {
    comm = readProcFile(path.join(procRoot, String(peer.pid), 'comm'), 'utf8').trimEnd();
  } catch {
    return false;
  }
  return isQemuName(comm);
}
