/**
 * The cgroup side of power limits (src/power-limit/cgroups.ts): on this host's real cgroup v1 cpu
 * hierarchy (root only) with a real process's thread, and on a cgroup2 tree laid out in a temp dir
 * (this host's cgroup2 has no cpu controller).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { cgroupBandwidth, cpuGroupOf, cpuMounts } from '../../src/power-limit/cgroups.js';
import { missing } from '../support/env.js';
import { removeGroup } from '../support/cgroup.js';

const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanups.splice(0).reverse()) c();
});

const V1 = cpuMounts(fs.readFileSync('/proc/self/mountinfo', 'utf8')).v1;

function v1Missing(): string | null {
  return missing({ root: true }) ?? (V1 === undefined ? 'no cgroup v1 cpu hierarchy on this host' : null);
}

function child(): ChildProcess {
  const c = spawn('sleep', ['300'], { stdio: 'ignore' });
  cleanups.push(() => c.kill('SIGKILL'));
  return c;
}

function groupOf(pid: number): string {
  return cpuGroupOf(fs.readFileSync(`/proc/${pid}/task/${pid}/cgroup`, 'utf8'), { v1: V1! })!.rel;
}

describe('cgroup bandwidth (v1, this host)', () => {
  it('moves a thread of a shared group into a group of its own, and back with the group removed, when limited and let go', (ctx) => {
    const why = v1Missing();
    if (why) return ctx.skip(why);
    const shared = path.join(V1!, `vmsr-test-shared-${process.pid}`);
    fs.mkdirSync(shared);
    cleanups.push(() => removeGroup(shared));
    const c = child();
    const pid = c.pid!;
    // The shared group holds the test runner too: not the VM's to throttle.
    fs.writeFileSync(path.join(shared, 'tasks'), `${pid}\n`);
    fs.writeFileSync(path.join(shared, 'tasks'), `${process.pid}\n`);
    cleanups.push(() => fs.writeFileSync(path.join(V1!, 'tasks'), `${process.pid}\n`));
    const before = groupOf(pid);
    const bw = cgroupBandwidth('/proc')(pid, [pid]);
    const made = path.join(shared, `vmsr-helper-vm-${pid}`);
    expect(bw.groups).toEqual([made]);
    expect(groupOf(pid)).toBe(`${before}/vmsr-helper-vm-${pid}`);
    expect(bw.set(0.25)).toEqual({ quotaUs: 25000, periodUs: 100000 });
    expect(fs.readFileSync(path.join(made, 'cpu.cfs_quota_us'), 'utf8')).toBe('25000\n');
    bw.release();
    expect(groupOf(pid)).toBe(before);
    expect(fs.existsSync(made)).toBe(false);
  });

  for (const theirs of ['-1\n', '30000\n', '150000\n'])
    it(`gives a VM's own group its quota ${JSON.stringify(theirs)} back byte for byte, never raising it, when limited and let go`, (ctx) => {
      const why = v1Missing();
      if (why) return ctx.skip(why);
      const own = path.join(V1!, `vmsr-test-own-${process.pid}`);
      fs.mkdirSync(own);
      cleanups.push(() => removeGroup(own));
      fs.writeFileSync(path.join(own, 'cpu.cfs_quota_us'), theirs);
      const c = child();
      const pid = c.pid!;
      fs.writeFileSync(path.join(own, 'tasks'), `${pid}\n`);
      cleanups.push(() => fs.writeFileSync(path.join(V1!, 'tasks'), `${pid}\n`));
      const bw = cgroupBandwidth('/proc')(pid, [pid]);
      expect(bw.groups).toEqual([own]);
      const cap = theirs === '-1\n' ? Infinity : Number(theirs);
      for (const cpus of [0.1, 0.5, 1]) expect(bw.set(cpus).quotaUs).toBe(Math.min(cap, cpus * 100000));
      // Someone else lowers it meanwhile: theirs from now on, and what is given back.
      fs.writeFileSync(path.join(own, 'cpu.cfs_quota_us'), '20000\n');
      expect(bw.set(1).quotaUs).toBe(20000);
      bw.release();
      expect(fs.readFileSync(path.join(own, 'cpu.cfs_quota_us'), 'utf8')).toBe('20000\n');
      bw.release();
    });

  for (const kind of ['own', 'made'] as const)
    it(`takes over the ${kind === 'own' ? "VM's own group" : 'group it made'} from what a previous process carried, giving back the bytes from before that process, not what the file holds`, (ctx) => {
      const why = v1Missing();
      if (why) return ctx.skip(why);
      const dir = path.join(V1!, `vmsr-test-carried-${kind}-${process.pid}`);
      fs.mkdirSync(dir);
      cleanups.push(() => removeGroup(dir));
      fs.writeFileSync(path.join(dir, 'cpu.cfs_quota_us'), '150000\n');
      const c = child();
      const pid = c.pid!;
      fs.writeFileSync(path.join(dir, 'tasks'), `${pid}\n`);
      // Shared with the test runner: the helper makes a group of its own for the VM.
      if (kind === 'made') fs.writeFileSync(path.join(dir, 'tasks'), `${process.pid}\n`);
      cleanups.push(() => fs.writeFileSync(path.join(V1!, 'tasks'), `${process.pid}\n`));
      cleanups.push(() => fs.writeFileSync(path.join(V1!, 'tasks'), `${pid}\n`));
      const first = cgroupBandwidth('/proc')(pid, [pid]);
      first.set(0.25);
      // The first process dies here (its fds go with it): what its checkpoint carried.
      const carried = first.state();
      const held = first.groups[0]!;
      expect(carried).toEqual([{ dir: held, saved: kind === 'own' ? '150000\n' : '-1\n', written: '25000\n', made: kind === 'made' }]);
      // A carried quota that is no quota is refused, not written.
      expect(() => cgroupBandwidth('/proc')(pid, [pid], [{ ...carried[0]!, saved: 'junk' }])).toThrow(/holds "junk", not a quota/);
      const next = cgroupBandwidth('/proc')(pid, [pid], carried);
      expect(next.groups).toEqual([held]);
      expect(next.set(0.5).quotaUs).toBe(50000);
      next.release();
      expect(fs.readFileSync(path.join(dir, 'cpu.cfs_quota_us'), 'utf8')).toBe('150000\n');
      if (kind === 'made') {
        expect(fs.existsSync(held)).toBe(false);
        expect(groupOf(pid)).toBe(`/${path.basename(dir)}`);
      }
    });

  it('gives the quota back byte for byte when the limit never saw another writer', (ctx) => {
    const why = v1Missing();
    if (why) return ctx.skip(why);
    const own = path.join(V1!, `vmsr-test-plain-${process.pid}`);
    fs.mkdirSync(own);
    cleanups.push(() => removeGroup(own));
    fs.writeFileSync(path.join(own, 'cpu.cfs_quota_us'), '70000\n');
    const c = child();
    fs.writeFileSync(path.join(own, 'tasks'), `${c.pid}\n`);
    cleanups.push(() => fs.writeFileSync(path.join(V1!, 'tasks'), `${c.pid}\n`));
    const before = fs.readFileSync(path.join(own, 'cpu.cfs_quota_us'));
    const bw = cgroupBandwidth('/proc')(c.pid!, [c.pid!]);
    bw.set(0.2);
    expect(fs.readFileSync(path.join(own, 'cpu.cfs_quota_us'), 'utf8')).toBe('20000\n');
    bw.release();
    expect(fs.readFileSync(path.join(own, 'cpu.cfs_quota_us'))).toEqual(before);
  });
});

/** A cgroup2 tree and the /proc files that point into it, in a temp dir. */
function fakeV2(groups: Record<string, { max: string; threads: number[] }>, threadGroup: Record<number, string>, pid: number) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-cg2-'));
  cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
  const proc = path.join(dir, 'proc');
  const cg = path.join(dir, 'cgroup');
  fs.mkdirSync(path.join(proc, 'self'), { recursive: true });
  fs.writeFileSync(path.join(proc, 'self/mountinfo'), `41 31 0:38 / ${cg} rw,relatime - cgroup2 cgroup2 rw\n`);
  for (const [rel, g] of Object.entries(groups)) {
    fs.mkdirSync(path.join(cg, rel), { recursive: true });
    fs.writeFileSync(path.join(cg, rel, 'cpu.max'), g.max);
    fs.writeFileSync(path.join(cg, rel, 'cgroup.threads'), g.threads.map((t) => `${t}\n`).join(''));
  }
  for (const [tid, rel] of Object.entries(threadGroup)) {
    fs.mkdirSync(path.join(proc, String(pid), 'task', tid), { recursive: true });
    fs.writeFileSync(path.join(proc, String(pid), 'task', tid, 'cgroup'), `0::${rel}\n`);
  }
  return { proc, cg };
}

describe('cgroup bandwidth (v2, a tree in a temp dir)', () => {
  it("splits the quota over libvirt's vcpuN groups by their vCPUs, never above theirs, and gives cpu.max back byte for byte", () => {
    const { proc, cg } = fakeV2(
      {
        '/m.scope/libvirt/vcpu0': { max: 'max 100000\n', threads: [11] },
        '/m.scope/libvirt/vcpu1': { max: '40000 100000\n', threads: [12] },
      },
      { 11: '/m.scope/libvirt/vcpu0', 12: '/m.scope/libvirt/vcpu1' },
      10,
    );
    const bw = cgroupBandwidth(proc)(10, [11, 12]);
    expect(bw.set(1.2)).toEqual({ quotaUs: 60000 + 40000, periodUs: 100000 });
    expect(fs.readFileSync(path.join(cg, 'm.scope/libvirt/vcpu0/cpu.max'), 'utf8')).toBe('60000 100000\n');
    expect(fs.readFileSync(path.join(cg, 'm.scope/libvirt/vcpu1/cpu.max'), 'utf8')).toBe('40000 100000\n');
    bw.release();
    expect(fs.readFileSync(path.join(cg, 'm.scope/libvirt/vcpu0/cpu.max'), 'utf8')).toBe('max 100000\n');
    expect(fs.readFileSync(path.join(cg, 'm.scope/libvirt/vcpu1/cpu.max'), 'utf8')).toBe('40000 100000\n');
  });

  it('refuses, saying how to give the VM a group of its own, when its vCPU threads share a v2 group with another process', () => {
    const { proc } = fakeV2({ '/user.slice': { max: 'max 100000\n', threads: [11, 99] } }, { 11: '/user.slice' }, 10);
    expect(() => cgroupBandwidth(proc)(10, [11])).toThrow(
      /cannot limit the power of the VM of pid 10: .*share the cgroup .* with other processes; run the VM in a cgroup of its own/,
    );
  });

  it('refuses a quota file that holds no quota, naming it', () => {
    const { proc } = fakeV2({ '/vm': { max: 'garbage\n', threads: [11] } }, { 11: '/vm' }, 10);
    expect(() => cgroupBandwidth(proc)(10, [11])).toThrow(/cpu.max holds "garbage\\n", not a quota/);
  });
});
