/**
 * Who the share rule prefers: root's processes, and processes in one of the preferred groups
 * (--socket-group, e.g. kvm), by their real, effective or supplementary groups: a process cannot join
 * a group it is not given, so a local user cannot make its own processes preferred.
 */
import fs from 'node:fs';
import path from 'node:path';
import { readProcFileOr } from '../os/proc-file.js';
import { parseProcStatus } from '../os/privileges/proc-status.js';
import type { ShareOwner } from './uid-share.js';

function isPreferredOwner(procRoot: string, pid: number, uid: number, groups: readonly number[]): boolean {
  if (uid === 0) return true;
  if (groups.length === 0) return false;
  const text = readProcFileOr(path.join(procRoot, String(pid), 'status'), 'utf8');
  if (text === null) return false; // gone: nothing to prefer
  const st = parseProcStatus(text);
  return groups.some((g) => st.gid.slice(0, 2).includes(g) || st.groups.includes(g));
}

/** The owner of /proc/<pid> for the share rule; null when the process is gone. */
export function shareOwnerOf(procRoot: string, pid: number, groups: readonly number[]): ShareOwner | null {
  let uid: number;
  try {
    uid = fs.statSync(path.join(procRoot, String(pid))).uid;
  } catch {
    return null;
  }
  return { uid, preferred: isPreferredOwner(procRoot, pid, uid, groups) };
}

/** Whether a connection's peer is a preferred owner: root, a primary gid (SO_PEERCRED, as of connect) in `groups`, or in one now. */
export function isPreferredPeer(procRoot: string, peer: { pid: number; uid: number; gid: number }, groups: readonly number[]): boolean {
  return peer.uid === 0 || groups.includes(peer.gid) || isPreferredOwner(procRoot, peer.pid, peer.uid, groups);
}
