/**
 * ProcScanner on a /proc tree written by the test (directories with stat, cmdline, task/<tid>/comm,
 * loadavg, uptime), for what the real /proc cannot be made to do on demand: a pid reused by a QEMU
 * between two scans, a process that execs QEMU after it was first seen, and the cost of a quiet scan;
 * and the kernel fact the pid look-ups rest on, on the real /proc.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { parseProcessStat } from '../../src/discovery/names.js';
import { MAX_PIDS_PROBED, ProcScanner } from '../../src/discovery/scanner.js';
import { ThreadedProcess } from '../support/threads.js';
import { RatioEngine } from '../../src/ratio/attribution.js';
import { MAX_VCPUS } from '../../src/model/vcpus.js';
import { host } from '../ratio/helpers.js';

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true });
});

class FakeProc {
  readonly root = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-fakeproc-'));
  uptime = 1000;
  constructor() {
    dirs.push(this.root);
    this.lastPid(1);
  }
  lastPid(pid: number): void {
    fs.writeFileSync(path.join(this.root, 'loadavg'), `0.00 0.00 0.00 1/100 ${pid}\n`);
    fs.writeFileSync(path.join(this.root, 'uptime'), `${this.uptime}.00 0.00\n`);
  }
  /**
   * A process: comm, starttime (clock ticks, CLK_TCK 100), argv, thread names (index 0 = main).
   * `thread`: not a process but a thread looked up by its tid (exit_signal -1), as /proc/<tid> of a
   * thread that is not its process's main one resolves.
   */
  process(pid: number, o: { comm: string; starttime: number; argv: string[]; threads?: string[]; thread?: boolean }): void {
    const d = path.join(this.root, String(pid));
    fs.rmSync(d, { recursive: true, force: true });
    const threads = o.threads ?? [o.comm];
    const fields = Array.from({ length: 50 }, () => '0');
    fields[17] = String(threads.length); // num_threads (field 20)
    fields[19] = String(o.starttime); // starttime (field 22)
    fields[35] = o.thread ? '-1' : '17'; // exit_signal (field 38)
    fs.mkdirSync(path.join(d, 'task'), { recursive: true });
    fs.writeFileSync(path.join(d, 'stat'), `${pid} (${o.comm}) ${fields.join(' ')}\n`);
    fs.writeFileSync(path.join(d, 'cmdline'), o.argv.join('\0') + '\0');
    threads.forEach((name, i) => {
      fs.mkdirSync(path.join(d, 'task', String(pid + i)));
      fs.writeFileSync(path.join(d, 'task', String(pid + i), 'comm'), `${name}\n`);
    });
  }
  remove(pid: number): void {
    fs.rmSync(path.join(this.root, String(pid)), { recursive: true, force: true });
  }
}

const qemu = (name: string) => ({
  comm: 'qemu-system-x86',
  argv: ['qemu-system-x86_64', '-name', name, '-smp', '2,sockets=2'],
  threads: ['qemu-system-x86', 'CPU 0/KVM', 'CPU 1/KVM'],
});

describe('ProcScanner', () => {
  it('finds a QEMU on a pid reused since the last scan, though the old process was known not to be a VM', () => {
    const p = new FakeProc();
    p.process(500, { comm: 'bash', starttime: 1000, argv: ['bash'] });
    p.lastPid(510);
    const s = new ProcScanner(p.root, { clkTck: 100, fullRecheckEvery: 1000 });
    expect(s.scan()).toEqual([]);
    // bash (old, not young) exits; 32768 pids later the same pid is a QEMU, between two scans.
    p.uptime += 5000;
    p.process(500, { ...qemu('reused'), starttime: 590_000 });
    p.lastPid(505); // pids wrapped at pid_max and came round to 505

    const found = s.scan();
    expect(found.map((v) => [v.pid, v.name, v.vcpus.map((c) => c.vpkg)])).toEqual([[500, 'reused', [0, 1]]]);
  });

  it('finds at the full recheck a QEMU-named process whose vCPU threads were named after it was first looked at (no stat field changed)', () => {
    const p = new FakeProc();
    // Seen between its vCPU thread's start and that thread's naming, its executable not QEMU's (a look-alike, or a QEMU under another name).
    const starting = { ...qemu('late'), starttime: 1000, threads: ['qemu-system-x86', 'qemu-system-x86', 'qemu-system-x86'] };
    p.process(600, starting);
    fs.symlinkSync('/usr/bin/python3', path.join(p.root, '600', 'exe'));
    p.lastPid(610);
    const fullEvery = 5;
    const s = new ProcScanner(p.root, { clkTck: 100, fullRecheckEvery: fullEvery, youngSeconds: 0 });
    expect(s.scan()).toEqual([]);
    for (const [i, name] of ['CPU 0/KVM', 'CPU 1/KVM'].entries())
      fs.writeFileSync(path.join(p.root, '600', 'task', String(601 + i), 'comm'), `${name}\n`);
    const found: string[] = [];
    for (let scan = 2; scan < fullEvery; scan++) found.push(...s.scan().map((v) => `${v.pid} ${v.name}`));
    expect(found, 'between full rechecks nothing is read beyond the stat line').toEqual([]);
    expect(s.scan().map((v) => [v.pid, v.name, v.vcpus.map((c) => c.vpkg)])).toEqual([[600, 'late', [0, 1]]]);
  });

  it('a scanner restored from state() reads only the stat line of a known process, and examines a pid reused during the restart as new', () => {
    const p = new FakeProc();
    // Multithreaded: a scan that does not know them reads their thread names, looking for vCPUs.
    for (let pid = 100; pid < 104; pid++) p.process(pid, { comm: 'java', starttime: 100, argv: ['java'], threads: ['java', 'GC', 'C2'] });
    p.process(300, { ...qemu('kept'), starttime: 200 });
    p.lastPid(300);
    const before = new ProcScanner(p.root, { clkTck: 100, fullRecheckEvery: 1000 });
    expect(before.scan().map((v) => v.pid)).toEqual([300]);
    const known = before.state();
    expect(known.sort((a, b) => a.pid - b.pid)).toEqual([100, 101, 102, 103].map((pid) => ({ pid, starttime: 100 })));
    // During the restart pid 103 is reused by a QEMU.
    p.uptime += 5000;
    p.process(103, { ...qemu('new'), starttime: 400_000 });
    const after = new ProcScanner(p.root, { clkTck: 100, fullRecheckEvery: 1000 });
    after.restore(known);
    expect(after.adopt(300, 200)).toBe(true);
    expect(after.adopt(300, 201)).toBe(false); // not the process the snapshot names
    expect(after.adopt(101, 999)).toBe(false); // another process now
    expect(after.current(300)?.vcpus.map((c) => c.vpkg)).toEqual([0, 1]);
    const probes = after.cost.threadProbes;
    // The VM discovery had found is not offered again; the reused pid is; the known processes are not read past stat.
    expect(after.scan().map((v) => [v.pid, v.name])).toEqual([[103, 'new']]);
    expect(after.cost.threadProbes - probes).toBe(3); // the new QEMU's three threads only
  });

  it('does not re-read an old non-VM pid outside the range of new pids, and reads only loadavg when no pid was handed out', () => {
    const p = new FakeProc();
    for (let pid = 100; pid < 110; pid++) p.process(pid, { comm: 'sshd', starttime: 100, argv: ['sshd'] });
    p.lastPid(109);
    const s = new ProcScanner(p.root, { clkTck: 100, fullRecheckEvery: 1000 });
    s.scan();
    const reads = s.cost.statReads;
    p.process(200, { comm: 'sleep', starttime: 99_000, argv: ['sleep', '1'] });
    p.lastPid(200);
    s.scan();
    expect(s.cost.statReads - reads).toBe(1); // only the new pid
    s.scan();
    expect(s.cost.quietScans).toBe(1);
  });

  it(`looks up each new pid instead of listing /proc when at most ${MAX_PIDS_PROBED} were handed out, and lists /proc when more were`, () => {
    const p = new FakeProc();
    p.process(100, { comm: 'sshd', starttime: 100, argv: ['sshd'] });
    p.lastPid(100);
    const s = new ProcScanner(p.root, { clkTck: 100, fullRecheckEvery: 1000 });
    s.scan();
    expect(s.cost.listings).toBe(1);
    p.process(150, { ...qemu('probed'), starttime: 99_000 });
    p.lastPid(100 + MAX_PIDS_PROBED);
    expect(s.scan().map((v) => [v.pid, v.name])).toEqual([[150, 'probed']]);
    expect([s.cost.listings, s.cost.probeScans]).toEqual([1, 1]);
    p.process(300, { ...qemu('listed'), starttime: 99_000 });
    p.lastPid(100 + 2 * MAX_PIDS_PROBED + 1);
    expect(s.scan().map((v) => [v.pid, v.name])).toEqual([[300, 'listed']]);
    expect([s.cost.listings, s.cost.probeScans]).toEqual([2, 1]);
  });

  it('a thread looked up by its tid (a new vCPU thread of a known VM, exit_signal -1) is not taken for a process', () => {
    const p = new FakeProc();
    p.process(100, { comm: 'sshd', starttime: 100, argv: ['sshd'] });
    p.lastPid(100);
    const s = new ProcScanner(p.root, { clkTck: 100, fullRecheckEvery: 1000 });
    s.scan();
    // what /proc/<tid> of a QEMU's vCPU thread shows: the process's command line and threads
    p.process(120, { ...qemu('a-thread'), starttime: 99_000, thread: true });
    p.lastPid(125);
    expect(s.scan()).toEqual([]);
    expect(s.cost.probeScans).toBe(1);
    expect(s.cost.cmdlineReads).toBe(0);
  });

  it('finds a young process that execs QEMU after it was first seen (libvirt forks, then execs)', () => {
    const p = new FakeProc();
    p.process(300, { comm: 'rpc-libvirtd', starttime: p.uptime * 100 - 10, argv: ['/usr/sbin/libvirtd'] });
    p.lastPid(300);
    const s = new ProcScanner(p.root, { clkTck: 100 });
    expect(s.scan()).toEqual([]);
    p.process(300, { ...qemu('guest-1'), starttime: p.uptime * 100 - 10 }); // exec keeps pid and starttime
    expect(s.scan().map((v) => v.name)).toEqual(['guest-1']);
  });

  it('a QEMU-named process without vCPU thread names whose executable cannot be read is whole-VM; a process without a command line (a kernel thread) is not a VM', () => {
    const p = new FakeProc();
    p.process(400, {
      comm: 'qemu-kvm',
      starttime: 5,
      argv: ['/usr/libexec/qemu-kvm', '-uuid', '00000000-0000-4000-8000-000000000001'],
      threads: ['qemu-kvm', 'qemu-kvm', 'qemu-kvm'],
    });
    p.process(401, { comm: 'kvm', starttime: 5, argv: [] });
    p.lastPid(401);
    const s = new ProcScanner(p.root, { clkTck: 100 });
    const found = s.scan();
    expect(found.map((v) => [v.pid, v.wholeVmOnly, v.vcpus, v.uuid?.toString('hex')])).toEqual([
      [400, true, [{ tid: 400, vpkg: 0 }], '00000000000040008000000000000001'],
    ]);
  });

  it('refine: a hot-plugged vCPU joins, an unplugged one leaves, a renamed tid is re-classified', () => {
    const p = new FakeProc();
    p.process(600, { ...qemu('hp'), starttime: 5 });
    p.lastPid(602);
    const s = new ProcScanner(p.root, { clkTck: 100 });
    expect(s.scan()[0]!.vcpus).toEqual([
      { tid: 601, vpkg: 0 },
      { tid: 602, vpkg: 1 },
    ]);
    const line = (tid: number, comm: string) => `${tid} (${comm}) S 0`;
    const lines = new Map([
      [600, line(600, 'qemu-system-x86')],
      [601, line(601, 'CPU 0/KVM')],
      [602, line(602, 'CPU 1/KVM')],
    ]);
    expect(s.refine(600, lines)).toBeNull();
    lines.set(610, line(610, 'CPU 1/KVM'));
    lines.delete(602);
    expect(s.refine(600, lines)!.vcpus).toEqual([
      { tid: 601, vpkg: 0 },
      { tid: 610, vpkg: 1 },
    ]);
    lines.set(601, line(601, 'worker'));
    expect(s.refine(600, lines)!.vcpus).toEqual([{ tid: 610, vpkg: 1 }]);
  });

  it('gives a process claiming 256 sockets with one thread named CPU 255/KVM one virtual package, and no more when it renames the thread', () => {
    const p = new FakeProc();
    p.process(800, {
      comm: 'qemu-system-x86',
      starttime: 5,
      argv: ['qemu-system-x86_64', '-name', 'wide', '-smp', 'sockets=256,maxcpus=256,cpus=256'],
      threads: ['qemu-system-x86', 'CPU 255/KVM'],
    });
    p.lastPid(801);
    const s = new ProcScanner(p.root, { clkTck: 100 });
    const d = s.scan()[0]!;
    expect(d.topology.sockets).toBe(256); // what the command line claims
    expect(d.vcpus).toEqual([{ tid: 801, vpkg: 0 }]); // what the threads show
    const engine = new RatioEngine(host());
    const vmId = engine.register({ pid: d.pid, starttime: d.starttime, vcpus: d.vcpus });
    for (const i of [3, 17, 128, 200]) {
      const r = s.refine(
        800,
        new Map([
          [800, '800 (qemu-system-x86) S 0'],
          [801, `801 (CPU ${i}/KVM) S 0`],
        ]),
      )!;
      expect(r.vcpus).toEqual([{ tid: 801, vpkg: 0 }]);
      engine.updateVcpus(vmId, r.vcpus);
    }
    expect(engine.nvpkg(vmId)).toBe(1);
  });

  it('gives a VM with vCPU threads in guest sockets 0, 1 and a hot-plugged 3 three virtual packages, socket 3 the last', () => {
    const p = new FakeProc();
    p.process(900, {
      comm: 'qemu-system-x86',
      starttime: 5,
      argv: ['qemu-system-x86_64', '-smp', '4,sockets=4,maxcpus=8'],
      threads: ['qemu-system-x86', 'CPU 0/KVM', 'CPU 1/KVM', 'CPU 2/KVM', 'CPU 3/KVM'],
    });
    p.lastPid(904);
    const s = new ProcScanner(p.root, { clkTck: 100 });
    expect(s.scan()[0]!.vcpus.map((v) => v.vpkg)).toEqual([0, 0, 1, 1]);
    const lines = new Map([
      [900, '900 (qemu-system-x86) S 0'],
      [901, '901 (CPU 0/KVM) S 0'],
      [902, '902 (CPU 1/KVM) S 0'],
      [903, '903 (CPU 2/KVM) S 0'],
      [904, '904 (CPU 3/KVM) S 0'],
      [907, '907 (CPU 6/KVM) S 0'],
    ]);
    expect(s.refine(900, lines)!.vcpus.map((v) => v.vpkg)).toEqual([0, 0, 1, 1, 2]);
  });

  it('refine: a process naming more than MAX_VCPUS threads as vCPUs gets the MAX_VCPUS lowest tids, which the engine takes', () => {
    const p = new FakeProc();
    p.process(700, { ...qemu('many'), starttime: 5 });
    p.lastPid(702);
    const s = new ProcScanner(p.root, { clkTck: 100 });
    const d = s.scan()[0]!;
    const engine = new RatioEngine(host());
    const vmId = engine.register({ pid: d.pid, starttime: d.starttime, vcpus: d.vcpus });
    const lines = new Map([[700, '700 (qemu-system-x86) S 0']]);
    for (let i = 0; i < MAX_VCPUS + 3; i++) lines.set(1000 + i, `${1000 + i} (CPU ${i}/KVM) S 0`);
    const c = s.refine(700, lines)!;
    expect(c.vcpus).toHaveLength(MAX_VCPUS);
    expect([c.vcpus[0]!.tid, c.vcpus.at(-1)!.tid]).toEqual([1000, 1000 + MAX_VCPUS - 1]);
    expect(() => engine.updateVcpus(vmId, c.vcpus)).not.toThrow();
  });
});

describe('exit_signal on the real /proc', () => {
  it('is -1 in /proc/<tid>/stat of a thread that is not the main one, and not -1 for the process itself', async () => {
    const p = new ThreadedProcess();
    try {
      await p.ready();
      await p.cmd('start 2');
      const read = (tid: number) => parseProcessStat(fs.readFileSync(`/proc/${tid}/stat`, 'latin1'))!;
      expect(read(p.pid).exitSignal).not.toBe(-1);
      const others = p.tids().filter((t) => t !== p.pid);
      expect(others.length).toBe(2);
      for (const tid of others) expect(read(tid).exitSignal).toBe(-1);
      expect(fs.readdirSync('/proc')).not.toContain(String(others[0])); // resolvable, but not listed
    } finally {
      await p.kill();
    }
  });
});

describe('ProcScanner shares of the discovery cap', () => {
  it('tracks at most a quarter of the cap for one uid that is not preferred, still finds a root VM after them, and says which option to raise', () => {
    const p = new FakeProc();
    const cap = 16;
    const fakes = Array.from({ length: cap + 1 }, (_, i) => 1000 + i * 10);
    for (const pid of fakes) {
      p.process(pid, { ...qemu(`fake-${pid}`), starttime: 1000 });
      fs.chownSync(path.join(p.root, String(pid)), 65534, 65534);
    }
    p.lastPid(5000);
    const full: { pid: number; bound: string; message: string }[] = [];
    const s = new ProcScanner(p.root, { clkTck: 100, fullRecheckEvery: 1000, maxDiscoveredVms: cap, onFull: (f) => full.push(f) });
    const found = s.scan();
    expect(found.length).toBe(cap / 4);
    expect(full.length).toBe(fakes.length - cap / 4);
    expect(full[0]).toMatchObject({ bound: 'uid' });
    expect(full[0]!.message).toMatch(/uid 65534 has 4 VMs tracked, the 4 one uid may have .*raise --max-discovered-vms/);

    p.process(6000, { ...qemu('real'), starttime: 2000 }); // root's (the test's own uid)
    p.lastPid(6010);
    expect(s.scan().map((v) => v.name)).toEqual(['real']);

    // A tracked fake that ends frees its slot: a new one of the same uid takes it.
    s.forget(found[0]!.pid);
    p.remove(found[0]!.pid);
    p.process(7000, { ...qemu('fake-7000'), starttime: 3000 });
    fs.chownSync(path.join(p.root, '7000'), 65534, 65534);
    p.lastPid(7010);
    expect(s.scan().map((v) => v.name)).toEqual(['fake-7000']);
  });

  it("a process in a preferred group is not bound by its uid's share", () => {
    const p = new FakeProc();
    for (const pid of [100, 110, 120]) {
      p.process(pid, { ...qemu(`q-${pid}`), starttime: 1000 });
      fs.chownSync(path.join(p.root, String(pid)), 64055, 64055);
      fs.writeFileSync(
        path.join(p.root, String(pid), 'status'),
        'Uid:\t64055\t64055\t64055\t64055\nGid:\t64055\t64055\t64055\t64055\nGroups:\t994\n',
      );
    }
    p.lastPid(200);
    const s = new ProcScanner(p.root, { clkTck: 100, fullRecheckEvery: 1000, maxDiscoveredVms: 4, preferredGroups: [994] });
    expect(s.scan().length).toBe(3);
    const t = new ProcScanner(p.root, { clkTck: 100, fullRecheckEvery: 1000, maxDiscoveredVms: 4 });
    expect(t.scan().length).toBe(1);
  });
});
