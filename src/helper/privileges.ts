/**
 * Dropping to CAP_SYS_RAWIO only (and to -u/-g), after the MSR fds and the socket are open.
 *
 * Linux credentials are per thread and Node has several (libuv pool, V8 platform workers). glibc
 * broadcasts set*id calls to every thread, so -u/-g change the whole process, and because
 * PR_SET_KEEPCAPS is set only on the main thread, every other thread loses all capabilities when the
 * uid leaves 0. capset, PR_CAPBSET_DROP and PR_SET_NO_NEW_PRIVS act on the calling thread only: the
 * main thread (which serves every MSR read, synchronously) ends with exactly CAP_SYS_RAWIO, and
 * threads created afterwards inherit that; threads that already existed keep what they had unless
 * the uid change cleared it. describeThreads() reports each thread's result.
 */
import fs from 'node:fs';
import path from 'node:path';
import {
  capget,
  capset,
  prctl,
  PR_CAPBSET_DROP,
  PR_SET_KEEPCAPS,
  PR_SET_NO_NEW_PRIVS,
  setgroups,
  setresgid,
  setresuid,
} from '../native/libc.js';

const CAP_SETPCAP = 8;
export const CAP_SYS_RAWIO = 17;
export const RAWIO_MASK = 1n << BigInt(CAP_SYS_RAWIO);
const PR_CAP_AMBIENT = 47;
const PR_CAP_AMBIENT_CLEAR_ALL = 4;

/** A user given as a name (looked up in passwd) or a number, like qemu-vmsr-helper's -u. */
export function resolveId(spec: string, dbText: string, what: 'user' | 'group'): number {
  const fix = what === 'user' ? 'give an existing user name or a numeric uid' : 'give an existing group name or a numeric gid';
  if (spec === '') throw new Error(`invalid ${what} '': ${fix}`);
  for (const line of dbText.split('\n')) {
    const f = line.split(':');
    if (f[0] === spec && f[2] !== undefined && /^\d+$/.test(f[2])) return Number(f[2]);
  }
  if (/^\d+$/.test(spec) && Number(spec) <= 0xfffffffe) return Number(spec);
  throw new Error(`invalid ${what} '${spec}': ${fix}`);
}

export function resolveUser(spec: string, passwd = readOr('/etc/passwd')): number {
  return resolveId(spec, passwd, 'user');
}

/** The primary group of a uid in passwd, used when -u is given without -g; undefined if unknown. */
export function primaryGroupOf(uid: number, passwd = readOr('/etc/passwd')): number | undefined {
  for (const line of passwd.split('\n')) {
    const f = line.split(':');
    if (f[2] === String(uid) && f[3] !== undefined && /^\d+$/.test(f[3])) return Number(f[3]);
  }
  return undefined;
}

export function resolveGroup(spec: string, group = readOr('/etc/group')): number {
  return resolveId(spec, group, 'group');
}

function readOr(file: string): string {
  try {
    return fs.readFileSync(file, 'utf8');
  } catch {
    return '';
  }
}

export interface DropOptions {
  uid?: number;
  gid?: number;
}

export interface DropReport {
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

/** Drops everything but CAP_SYS_RAWIO on the calling (main) thread, and to uid/gid when given. */
export function dropPrivileges(o: DropOptions): DropReport {
  const skipped: string[] = [];
  const start = capget();
  const canSetpcap = (start.effective & (1n << BigInt(CAP_SETPCAP))) !== 0n;
  // Bounding set first: dropping needs CAP_SETPCAP, which the steps below remove.
  if (canSetpcap) {
    const last = lastCap();
    for (let cap = 0; cap <= last; cap++) {
      if (cap === CAP_SYS_RAWIO) continue;
      try {
        prctl(PR_CAPBSET_DROP, cap);
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== 'EINVAL') throw e;
      }
    }
  } else skipped.push('bounding set (no CAP_SETPCAP)');
  try {
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL);
  } catch {
    skipped.push('ambient set');
  }
  if (o.gid !== undefined) {
    setgroups([o.gid]);
    setresgid(o.gid);
  } else if (o.uid !== undefined) {
    setgroups([]); // never carry root's supplementary groups to another user
  }
  if (o.uid !== undefined) {
    prctl(PR_SET_KEEPCAPS, 1); // keep the permitted set across the uid change (main thread only)
    setresuid(o.uid);
    prctl(PR_SET_KEEPCAPS, 0);
  }
  const keep = capget().permitted & RAWIO_MASK;
  capset({ effective: keep, permitted: keep, inheritable: 0n });
  prctl(PR_SET_NO_NEW_PRIVS, 1);
  return { skipped };
}

export interface ProcStatusCreds {
  uid: number[];
  gid: number[];
  groups: number[];
  capInh: bigint;
  capPrm: bigint;
  capEff: bigint;
  capBnd: bigint;
  capAmb: bigint;
  noNewPrivs: number;
}

/** The credential lines of /proc/<pid>/status (or a task's status). */
export function parseProcStatus(text: string): ProcStatusCreds {
  const field = (name: string): string => {
    const m = new RegExp(`^${name}:[ \\t]*(.*)$`, 'm').exec(text);
    return m?.[1]?.trim() ?? '';
  };
  const nums = (s: string) => (s === '' ? [] : s.split(/\s+/).map(Number));
  const hex = (s: string) => (/^[0-9a-f]+$/i.test(s) ? BigInt(`0x${s}`) : 0n);
  return {
    uid: nums(field('Uid')),
    gid: nums(field('Gid')),
    groups: nums(field('Groups')),
    capInh: hex(field('CapInh')),
    capPrm: hex(field('CapPrm')),
    capEff: hex(field('CapEff')),
    capBnd: hex(field('CapBnd')),
    capAmb: hex(field('CapAmb')),
    noNewPrivs: Number(field('NoNewPrivs') || '0'),
  };
}

export function capHex(v: bigint): string {
  return v.toString(16).padStart(16, '0');
}

/** Every thread's effective capabilities, to log what the per-thread caveat left behind. */
export function describeThreads(procSelf = '/proc/self'): { tid: number; capEff: string; uid: number }[] {
  const out: { tid: number; capEff: string; uid: number }[] = [];
  for (const tid of fs.readdirSync(path.join(procSelf, 'task'))) {
    try {
      const s = parseProcStatus(fs.readFileSync(path.join(procSelf, 'task', tid, 'status'), 'utf8'));
      out.push({ tid: Number(tid), capEff: capHex(s.capEff), uid: s.uid[1] ?? -1 });
    } catch {
      /* thread exited meanwhile */
    }
  }
  return out;
}
