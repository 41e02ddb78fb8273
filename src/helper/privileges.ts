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
  execve,
  keepAcrossExec,
  prctl,
  PR_CAPBSET_DROP,
  PR_SET_KEEPCAPS,
  PR_SET_NO_NEW_PRIVS,
  setgroups,
  setresgid,
  setresuid,
} from '../native/libc.js';

const CAP_SETGID = 6;
const CAP_SETUID = 7;
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

/** Set in the environment of the image re-executed by reexecWithRawioOnly, so it never loops. */
export const REEXEC_ENV = 'VMSR_HELPER_REEXEC';

/**
 * Without -u, capset cannot reach the threads Node started before the drop (V8 workers, the libuv
 * pool), so they would keep root's capabilities. Instead, before any work: clear the inheritable and
 * ambient sets, drop the bounding set to CAP_SYS_RAWIO and execve the same command. exec replaces
 * every thread, and a root process's new capabilities are capped by the bounding set, so every thread
 * of the new image starts with CAP_SYS_RAWIO alone. pid, environment, stdio and systemd's fd 3
 * survive exec. Returns (doing nothing) when not root, already re-executed, already reduced, or not
 * allowed to shrink the bounding set; the later dropPrivileges() still reports what it could do.
 */
export function reexecWithRawioOnly(
  o: { changingIds?: boolean } = {},
  argv: readonly string[] = [process.execPath, ...process.execArgv, ...process.argv.slice(1)],
): string {
  // -u/-g still need to change ids, and dropPrivileges() then drops the bounding set the rest of the
  // way; those three go in that same step, before the helper listens.
  const keep = o.changingIds ? [CAP_SYS_RAWIO, CAP_SETUID, CAP_SETGID, CAP_SETPCAP] : [CAP_SYS_RAWIO];
  const keepMask = keep.reduce((m, c) => m | (1n << BigInt(c)), 0n);
  if (process.env[REEXEC_ENV] !== undefined) {
    delete process.env[REEXEC_ENV];
    return `re-executed: every thread started with ${o.changingIds ? 'CAP_SYS_RAWIO (and CAP_SETUID/SETGID/SETPCAP for -u/-g)' : 'CAP_SYS_RAWIO alone'}`;
  }
  if (process.getuid?.() !== 0) return 'not root';
  const status = parseProcStatus(fs.readFileSync('/proc/self/status', 'utf8'));
  if ((status.capBnd & ~keepMask) === 0n && status.capInh === 0n && status.capAmb === 0n) return 'bounding set already reduced';
  const caps = capget();
  if ((caps.effective & (1n << BigInt(CAP_SETPCAP))) === 0n) return 'no CAP_SETPCAP to shrink the bounding set';
  capset({ effective: caps.effective, permitted: caps.permitted, inheritable: 0n });
  try {
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL);
  } catch {
    /* kernel without ambient capabilities */
  }
  dropBoundingSet(keep);
  // stdio, and systemd's sockets when they are ours (LISTEN_PID is kept: exec keeps the pid).
  const inherited = [0, 1, 2];
  if (process.env.LISTEN_PID === String(process.pid)) {
    const n = Number(process.env.LISTEN_FDS);
    if (Number.isInteger(n) && n > 0 && n < 64) for (let fd = 3; fd < 3 + n; fd++) inherited.push(fd);
  }
  for (const fd of inherited) {
    try {
      keepAcrossExec(fd);
    } catch {
      /* closed fd: the new image opens /dev/null in its place, as Node does for missing stdio */
    }
  }
  return execve(process.execPath, argv, { ...process.env, [REEXEC_ENV]: '1' });
}

function dropBoundingSet(keep: readonly number[] = [CAP_SYS_RAWIO]): void {
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

/** Drops everything but CAP_SYS_RAWIO on the calling (main) thread, and to uid/gid when given. */
export function dropPrivileges(o: DropOptions): DropReport {
  const skipped: string[] = [];
  const start = capget();
  const canSetpcap = (start.effective & (1n << BigInt(CAP_SETPCAP))) !== 0n;
  const bounding = parseProcStatus(fs.readFileSync('/proc/self/status', 'utf8')).capBnd;
  // Bounding set first: dropping needs CAP_SETPCAP, which the steps below remove. After
  // reexecWithRawioOnly it is already CAP_SYS_RAWIO alone.
  if (bounding !== RAWIO_MASK) {
    if (canSetpcap) dropBoundingSet();
    else skipped.push('bounding set (no CAP_SETPCAP)');
  }
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
