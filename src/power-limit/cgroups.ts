/**
 * The cgroup side of a power limit (docs/power-limits.md "The mechanism"): the groups holding a VM's
 * vCPU threads, found from /proc/<pid>/task/<tid>/cgroup on the cpu hierarchy (v1's `cpu` controller,
 * else the v2 tree), their quota file opened once and kept as an fd while the limit holds, and given
 * back byte for byte. A group that holds anything besides the VM's threads (the root, a user's
 * session) is not the VM's to throttle: on v1 the helper makes `vmsr-helper-vm-<pid>` under it and
 * moves the vCPU threads there (back again when it lets go); on v2 it refuses, saying how to give the
 * VM a group of its own.
 */
import fs from 'node:fs';
import path from 'node:path';
import { cannotError } from '../common/errors.js';
import { readProcFile } from '../os/proc-file.js';
import {
  formatQuota,
  groupQuotaUs,
  parseQuota,
  quotaFile,
  type BandwidthOpener,
  type CgroupVersion,
  type Quota,
  type VmBandwidth,
} from './cpu-bandwidth.js';
import type { HeldGroupState } from '../state/snapshot.js';

/** Where the cpu hierarchies are mounted (from /proc/self/mountinfo). */
interface CpuMounts {
  v1?: string;
  v2?: string;
}

/** The cpu controller's v1 mount and the cgroup2 mount, from mountinfo's text. */
export function cpuMounts(mountinfo: string): CpuMounts {
  const out: CpuMounts = {};
  for (const line of mountinfo.split('\n')) {
    const [left, right] = line.split(' - ');
    const point = left?.split(' ')[4];
    const [fstype, , opts] = right?.split(' ') ?? [];
    if (point === undefined) continue;
    if (fstype === 'cgroup' && (opts ?? '').split(',').includes('cpu')) out.v1 ??= point;
    if (fstype === 'cgroup2') out.v2 ??= point;
  }
  return out;
}

/** The group of a thread on the cpu hierarchy, from its /proc/.../cgroup text; null when it has none there. */
export function cpuGroupOf(text: string, mounts: CpuMounts): { version: CgroupVersion; rel: string } | null {
  let v2: string | null = null;
  for (const line of text.split('\n')) {
    const m = /^(\d+):([^:]*):(\/.*)$/.exec(line);
    if (!m) continue;
    if (m[1] !== '0' && mounts.v1 !== undefined && m[2]!.split(',').includes('cpu')) return { version: 1, rel: m[3]! };
    if (m[1] === '0' && m[2] === '') v2 = m[3]!;
  }
  return v2 !== null && mounts.v2 !== undefined ? { version: 2, rel: v2 } : null;
}

/** One group held: its quota fd, the bytes it had, the vCPUs of the VM in it. */
interface Held {
  version: CgroupVersion;
  dir: string;
  fd: number;
  saved: Buffer;
  quota: Quota;
  vcpus: number;
  written: string | null;
  /** A group the helper made: the threads it moved and the fd of their old group's tasks file. */
  made?: { tids: number[]; backFd: number };
}

const what = (pid: number) => `limit the power of the VM of pid ${pid}`;

/** The bandwidth opener of this host: cgroups under the mounts of `procRoot`/self/mountinfo. */
export function cgroupBandwidth(procRoot: string): BandwidthOpener {
  let mounts: CpuMounts | null = null;
  return (pid, tids, carried = []) =>
    openVm(procRoot, (mounts ??= cpuMounts(readProcFile(path.join(procRoot, 'self/mountinfo'), 'utf8'))), pid, tids, carried);
}

function openVm(
  procRoot: string,
  mounts: CpuMounts,
  pid: number,
  tids: readonly number[],
  carried: readonly HeldGroupState[],
): VmBandwidth {
  const byDir = new Map<string, { version: CgroupVersion; root: boolean; tids: number[] }>();
  for (const tid of tids) {
    const g = cpuGroupOf(readProcFile(path.join(procRoot, String(pid), 'task', String(tid), 'cgroup'), 'utf8'), mounts);
    if (g === null || g.rel.split('/').includes('..'))
      throw cannotError(
        what(pid),
        `thread ${tid} is in no cgroup of the cpu controller`,
        'mount the cpu controller (cgroup v1) or cgroup2',
      );
    const dir = path.join(g.version === 1 ? mounts.v1! : mounts.v2!, g.rel);
    const e = byDir.get(dir) ?? { version: g.version, root: g.rel === '/', tids: [] };
    e.tids.push(tid);
    byDir.set(dir, e);
  }
  const held: Held[] = [];
  try {
    for (const [dir, g] of byDir) {
      const c = carried.find((x) => x.dir === dir);
      held.push(c ? adoptGroup(pid, dir, g, c) : holdGroup(procRoot, pid, dir, g));
    }
  } catch (err) {
    for (const h of held) giveBack(h);
    throw err;
  }
  return bandwidthOf(held, tids.length);
}

/** Whether every thread in the group's task list is one of the VM's (a group of its own). */
function ownGroup(procRoot: string, pid: number, dir: string, v: CgroupVersion): boolean {
  let text: string;
  try {
    text = fs.readFileSync(path.join(dir, v === 1 ? 'tasks' : 'cgroup.threads'), 'utf8');
  } catch {
    return false;
  }
  const taskDir = path.join(procRoot, String(pid), 'task');
  return text
    .split('\n')
    .filter((l) => l !== '')
    .every((t) => /^\d+$/.test(t) && fs.existsSync(path.join(taskDir, t)));
}

function holdGroup(procRoot: string, pid: number, dir: string, g: { version: CgroupVersion; root: boolean; tids: number[] }): Held {
  const { version: v, tids } = g;
  if (!g.root && ownGroup(procRoot, pid, dir, v)) return openQuota(dir, v, tids.length);
  if (v === 2)
    throw cannotError(
      what(pid),
      `its vCPU threads share the cgroup ${dir} with other processes`,
      'run the VM in a cgroup of its own (libvirt does; or systemd-run --scope)',
    );
  const made = path.join(dir, `vmsr-helper-vm-${pid}`);
  fs.mkdirSync(made, { recursive: true });
  const backFd = fs.openSync(path.join(dir, 'tasks'), 'w');
  const moved: number[] = [];
  try {
    for (const tid of tids) {
      fs.writeFileSync(path.join(made, 'tasks'), `${tid}\n`);
      moved.push(tid);
    }
    return { ...openQuota(made, v, tids.length), made: { tids: moved, backFd } };
  } catch (err) {
    moveBack(moved, backFd);
    fs.closeSync(backFd);
    fs.rmdirSync(made);
    throw err;
  }
}

/**
 * A group a previous process held (the checkpoint): its bytes before that process, its last write; a
 * group it made (named for this VM, as holdGroup names it) has the VM's threads moved back when let go.
 */
function adoptGroup(pid: number, dir: string, g: { version: CgroupVersion; tids: number[] }, c: HeldGroupState): Held {
  const made = c.made && path.basename(dir) === `vmsr-helper-vm-${pid}` && g.version === 1;
  const h = openQuota(dir, g.version, g.tids.length, Buffer.from(c.saved, 'latin1'));
  h.written = c.written;
  if (made) h.made = { tids: g.tids, backFd: fs.openSync(path.join(path.dirname(dir), 'tasks'), 'w') };
  return h;
}

function openQuota(dir: string, v: CgroupVersion, vcpus: number, carried?: Buffer): Held {
  const fd = fs.openSync(path.join(dir, quotaFile(v)), 'r+');
  try {
    const saved = carried ?? readFd(fd);
    const period = v === 1 ? fs.readFileSync(path.join(dir, 'cpu.cfs_period_us'), 'utf8') : undefined;
    const quota = parseQuota(v, saved.toString('latin1'), period);
    if (quota === null) throw new Error(`${path.join(dir, quotaFile(v))} holds ${JSON.stringify(saved.toString('latin1'))}, not a quota`);
    return { version: v, dir, fd, saved, quota, vcpus, written: null };
  } catch (err) {
    fs.closeSync(fd);
    throw err;
  }
}

/** Writes a whole quota file through its fd (a cgroup file takes each write whole; a plain file, in tests, is cut to it). */
function writeFd(fd: number, text: string | Buffer): void {
  const b = typeof text === 'string' ? Buffer.from(text, 'latin1') : text;
  fs.writeSync(fd, b, 0, b.length, 0);
  if (fs.fstatSync(fd).isFile() && fs.fstatSync(fd).size > b.length) fs.ftruncateSync(fd, b.length);
}

function readFd(fd: number): Buffer {
  const b = Buffer.alloc(64);
  return Buffer.from(b.subarray(0, fs.readSync(fd, b, 0, b.length, 0)));
}

function moveBack(tids: readonly number[], backFd: number): void {
  for (const tid of tids) {
    try {
      fs.writeSync(backFd, `${tid}\n`);
    } catch {
      // ESRCH: the thread is gone, nothing to move.
    }
  }
}

/** Gives a group back its quota, byte for byte, and its threads their old group. */
function giveBack(h: Held): void {
  try {
    writeFd(h.fd, h.saved);
  } finally {
    fs.closeSync(h.fd);
    if (h.made) {
      moveBack(h.made.tids, h.made.backFd);
      fs.closeSync(h.made.backFd);
      try {
        fs.rmdirSync(h.dir);
      } catch {
        // A thread the kernel still counts in it, or someone else's child group: left, harmless without a quota.
      }
    }
  }
}

function bandwidthOf(held: Held[], nvcpu: number): VmBandwidth {
  let released = false;
  return {
    groups: held.map((h) => h.dir),
    set(cpus) {
      let quotaUs = 0;
      for (const h of held) {
        const now = readFd(h.fd).toString('latin1');
        // Someone else set a quota since our last write: theirs now, never raised, given back at the end.
        if (h.written !== null && now !== h.written) {
          const q = parseQuota(h.version, now, `${h.quota.periodUs}`);
          if (q !== null) [h.saved, h.quota] = [Buffer.from(now, 'latin1'), q];
        }
        const us = groupQuotaUs(cpus, h.vcpus, nvcpu, h.quota);
        h.written = formatQuota(h.version, us, h.quota.periodUs);
        writeFd(h.fd, h.written);
        quotaUs += Math.max(1000, us);
      }
      return { quotaUs, periodUs: held[0]?.quota.periodUs ?? 100000 };
    },
    release() {
      if (released) return;
      released = true;
      for (const h of held) giveBack(h);
    },
    state: () => held.map((h) => ({ dir: h.dir, saved: h.saved.toString('latin1'), written: h.written, made: h.made !== undefined })),
  };
}
