/**
 * Dropping to CAP_SYS_RAWIO only (and to -u/-g), after the MSR fds and the socket are open.
 *
 * Linux credentials are per thread and Node has several (libuv pool, V8 platform workers). glibc
 * broadcasts set*id calls to every thread, but capset, PR_CAPBSET_DROP and PR_SET_NO_NEW_PRIVS act
 * on the calling thread only. So as root the helper drops on the main thread and re-executes itself
 * (reexec.ts): every thread of the new image has the dropped credentials. Only when it cannot (not
 * root, no CAP_SETPCAP) does dropPrivileges() drop in process, main thread first; describeThreads()
 * reports each thread's result.
 */
import fs from 'node:fs';
import { capget, capset, prctl, PR_CAPBSET_DROP, PR_SET_KEEPCAPS, PR_SET_NO_NEW_PRIVS, setgroups, setresgid, setresuid } from '../libc.js';
import { parseProcStatus } from './proc-status.js';

export const CAP_SETPCAP = 8;
export const CAP_SYS_RAWIO = 17;
export const RAWIO_MASK = 1n << BigInt(CAP_SYS_RAWIO);
export const PR_CAP_AMBIENT = 47;
export const PR_CAP_AMBIENT_CLEAR_ALL = 4;

export interface DropOptions {
  uid?: number;
  gid?: number;
}

interface DropReport {
  /** Steps that could not be done (e.g. bounding set without CAP_SETPCAP when not root). */
  skipped: string[];
}

function lastCap(): number {
  try {
    const n = Number(fs.readFileSync('/proc/sys/kernel/cap_last_cap', 'utf8').trim());
    return Number.isInteger(n) && n > 0 && n < 64 ? n : 40;
  } catch {
    return 40;
  }
}

export function dropBoundingSet(keep: readonly number[] = [CAP_SYS_RAWIO]): void {
  const last = lastCap();
  for (let cap = 0; cap <= last; cap++) {
    if (keep.includes(cap)) continue;
    try {
      prctl(PR_CAPBSET_DROP, cap);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EINVAL') throw e;
    }
  }
}

/** -g/-u on every thread (glibc broadcasts set*id); the calling thread keeps its permitted set. */
export function changeIds(o: DropOptions): void {
  if (o.gid !== undefined) {
    setgroups([o.gid]);
    setresgid(o.gid);
  } else if (o.uid !== undefined) {
    setgroups([]); // never carry root's supplementary groups to another user
  }
  if (o.uid !== undefined) {
    prctl(PR_SET_KEEPCAPS, 1); // keep the permitted set across the uid change (calling thread)
    setresuid(o.uid);
    prctl(PR_SET_KEEPCAPS, 0);
  }
}

/**
 * The in-process drop, when the helper could not re-execute itself (not root, or no CAP_SETPCAP):
 * everything but CAP_SYS_RAWIO on the calling (main) thread, and to uid/gid when given.
 */
export function dropPrivileges(o: DropOptions): DropReport {
  const skipped: string[] = [];
  const start = capget();
  const canSetpcap = (start.effective & (1n << BigInt(CAP_SETPCAP))) !== 0n;
  const bounding = parseProcStatus(fs.readFileSync('/proc/self/status', 'utf8')).capBnd;
  // Bounding set first: dropping needs CAP_SETPCAP, which the steps below remove.
  if (bounding !== RAWIO_MASK) {
    if (canSetpcap) dropBoundingSet();
    else skipped.push('bounding set (no CAP_SETPCAP)');
  }
  try {
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL);
  } catch {
    skipped.push('ambient set');
  }
  changeIds(o);
  const keep = capget().permitted & RAWIO_MASK;
  capset({ effective: keep, permitted: keep, inheritable: 0n });
  prctl(PR_SET_NO_NEW_PRIVS, 1);
  return { skipped };
}
