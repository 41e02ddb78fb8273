/**
 * Discovery in the v2 service, on the real /proc: fake QEMU processes (python3 with QEMU's argv[0],
 * comm and vCPU thread names) that the test controls, package energy from FakeHost's MSR files.
 * Other QEMUs running on the machine are discovered too; every check filters by our pids.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { V2Client } from '../../src/client/v2-client.js';
import { type VmInfo, type VmUpdate } from '../../src/client/v2-replies.js';
import { startHarness, until, type Harness } from '../v2/harness.js';
import { FakeQemu } from '../support/fake-qemu.js';
import { ENDED_DISCOVERED_KEPT_SAMPLES } from '../../src/helper/v2/vm-lifecycle.js';
import { fail, ok } from '../../src/common/result.js';

const INTERVAL = 100;
let h: Harness;
let pump: NodeJS.Timeout;
const procs: FakeQemu[] = [];
const clients: V2Client[] = [];

beforeAll(async () => {
  h = await startHarness({ intervalMs: INTERVAL, discovery: true });
  // Steady package power: ~61 uJ per unit, 2000 units every 20 ms.
  pump = setInterval(() => h.addEnergy(2000), 20);
});
afterAll(async () => {
  clearInterval(pump);
  await h.close();
});
afterEach(async () => {
  for (const c of clients.splice(0)) await c.close();
  for (const p of procs.splice(0)) await p.kill();
});

async function fake(o: ConstructorParameters<typeof FakeQemu>[0]): Promise<FakeQemu> {
  const q = new FakeQemu(o);
  procs.push(q);
  return q.ready();
}

async function client(): Promise<V2Client> {
  const c = await V2Client.connect(h.socketPath);
  clients.push(c);
  return c;
}

async function listed(c: V2Client, pid: number, timeoutMs = 60_000): Promise<VmInfo> {
  let vm: VmInfo | undefined;
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    vm = (await c.list()).find((v) => v.pid === pid && !v.ended);
    if (vm) return vm;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`pid ${pid} not listed within ${timeoutMs} ms`);
}

const sum = (u: VmUpdate) => u.vpkgs.map((v) => Number(v.energyUj));

describe('discovery', { timeout: 180_000 }, () => {
  it('finds a QEMU-like process within 2 samples, with name, UUID and virtual packages from -smp', async () => {
    const c = await client();
    const q = await fake({
      vcpus: 4,
      args: ['-name', 'guest=fake-one,debug-threads=on', '-uuid', '5c6e8a2e-1b0f-4d1c-9a57-0e9a3f0c1d2e', '-smp', '4,sockets=2'],
    });
    // Late only when a LIST sent after 2 more samples still did not show it: a test process slowed
    // by a busy host polls late, which says nothing of the daemon.
    const before = h.service.stats.samples;
    let late = 0;
    let vm: VmInfo | undefined;
    for (const deadline = Date.now() + 60_000; vm === undefined && Date.now() < deadline;) {
      const at = h.service.stats.samples;
      vm = (await c.list()).find((v) => v.pid === q.pid && !v.ended);
      if (vm === undefined && at - before > 2) late = at - before;
      if (vm === undefined) await new Promise((r) => setTimeout(r, 20));
    }
    expect(vm, `pid ${q.pid} listed`).toBeDefined();
    expect(late, 'samples after its start at which a LIST still did not show it').toBe(0);
    expect(vm).toMatchObject({
      name: 'fake-one',
      uuid: '5c6e8a2e-1b0f-4d1c-9a57-0e9a3f0c1d2e',
      source: 'discovered',
      nvpkg: 2,
      wholeVmOnly: false,
      uid: 0,
      ended: false,
    });
  });

  it('gives the energy to the virtual package of the busy vCPU (CPU 2/KVM is in socket 1 of -smp 4,sockets=2)', async () => {
    const c = await client();
    const q = await fake({ vcpus: 4, args: ['-name', 'busy', '-smp', '4,sockets=2'] });
    await q.cmd('spin 2');
    const vm = await listed(c, q.pid);
    let last: VmUpdate | undefined;
    await c.observe(vm.hostVmId, (u) => (last = u));
    await until(() => last !== undefined && Number(last.vpkgs[1]!.energyUj) > 200_000, 60_000, 'vpkg 1 energy');
    const [e0, e1] = sum(last!);
    expect(e1).toBeGreaterThan(10 * e0!);
  });

  it('adds a hot-plugged vCPU thread to its virtual package, growing nvpkg', async () => {
    const c = await client();
    const q = await fake({ vcpus: 2, args: ['-smp', '2,maxcpus=4,sockets=2'] });
    const vm = await listed(c, q.pid);
    expect(vm.nvpkg).toBe(1);
    await q.cmd('add 2');
    await q.cmd('spin 2');
    let last: VmUpdate | undefined;
    await c.observe(vm.hostVmId, (u) => (last = u));
    await until(
      () => last !== undefined && last.vpkgs.length === 2 && Number(last.vpkgs[1]!.energyUj) > 200_000,
      60_000,
      'vpkg 1 after hotplug',
    );
    expect((await listed(c, q.pid)).nvpkg).toBe(2);
  });

  it('a process named like QEMU, without vCPU thread names, whose executable is not QEMU is not a VM', async () => {
    // Real QEMU without debug-threads (whole-VM energy) is in test/discovery/qemu.test.ts.
    const c = await client();
    const q = await fake({ vcpus: 2, vcpuNames: false, argv0: '/usr/bin/qemu-system-x86_64', args: ['-smp', '2,sockets=2'] });
    // A python3 process: with its executable readable (we are root) and no vCPU names, it is not a VM.
    await new Promise((r) => setTimeout(r, 4 * INTERVAL));
    expect((await c.list()).some((v) => v.pid === q.pid)).toBe(false);
  });

  it('a process only renamed to look like QEMU (argv[0], comm) is not a VM; with vCPU thread names it is one', async () => {
    const c = await client();
    const pretender = await fake({ vcpus: 0, argv0: 'qemu-system-x86_64', comm: 'qemu-system-x86' });
    const lookalike = await fake({ vcpus: 2, argv0: 'qemu-system-x86_64', comm: 'qemu-system-x86' });
    const vm = await listed(c, lookalike.pid);
    expect(vm.wholeVmOnly).toBe(false);
    await new Promise((r) => setTimeout(r, 3 * INTERVAL));
    expect((await c.list()).some((v) => v.pid === pretender.pid)).toBe(false);
  });

  it('an ended VM: observers get a last update with ended, LIST shows it ended, then it is dropped', async () => {
    const c = await client();
    const q = await fake({ vcpus: 1, args: ['-name', 'short'] });
    const vm = await listed(c, q.pid);
    const updates: VmUpdate[] = [];
    await c.observe(vm.hostVmId, (u) => updates.push(u));
    await q.kill();
    await until(() => updates.some((u) => u.ended), 60_000, 'ended update');
    const samplesAtEnd = h.service.stats.samples;
    expect((await c.list()).find((v) => v.hostVmId === vm.hostVmId)?.ended).toBe(true);
    await until(() => h.service.stats.samples > samplesAtEnd + ENDED_DISCOVERED_KEPT_SAMPLES + 1, 60_000, 'samples');
    expect((await c.list()).some((v) => v.hostVmId === vm.hostVmId)).toBe(false);
  });

  it('a client registering a discovered VM gets the same VM (one id, one LIST entry), which stays discovered after UNREGISTER', async () => {
    const c = await client();
    const q = await fake({ vcpus: 2, args: ['-name', 'both', '-smp', '2,sockets=2'] });
    const vm = await listed(c, q.pid);
    const reg = await client();
    const r = await reg.register({ pid: q.pid, vcpus: [...q.vcpuTids].map(([i, tid]) => ({ tid, vpkg: i })) });
    expect(r.vmId).toBe(vm.hostVmId);
    const mine = (await c.list()).filter((v) => v.pid === q.pid);
    expect(mine).toHaveLength(1);
    expect(mine[0]).toMatchObject({ source: 'registered', name: 'both', hostVmId: vm.hostVmId });
    await reg.unregister(r.vmId);
    expect((await c.list()).filter((v) => v.pid === q.pid)).toMatchObject([{ source: 'discovered', hostVmId: vm.hostVmId, ended: false }]);
  });
});

describe('discovery within the fd budget', () => {
  it('a VM whose threads do not fit is not sampled, and is taken at a later full rescan once they do', async () => {
    let room = 3; // fds the budget grants: less than the fake VM's 5 threads + 1
    // The VM first, with all its threads: a scan that caught it half started (2 threads) would find it fits.
    const q = new FakeQemu({ vcpus: 4, args: ['-name', 'too-big'] });
    let g: Awaited<ReturnType<typeof startHarness>> | undefined;
    try {
      await q.ready();
      g = await startHarness({
        intervalMs: 50,
        discovery: { fullRecheckEvery: 4 },
        fds: { canAdmit: (threads) => (threads + 1 <= room ? ok(undefined) : fail(`no room for ${threads} threads`)) },
      });
      const c = await V2Client.connect(g.socketPath);
      try {
        await new Promise((r) => setTimeout(r, 400));
        expect((await c.list()).some((v) => v.pid === q.pid)).toBe(false);
        room = 1000;
        expect((await listed(c, q.pid, 30_000)).name).toBe('too-big');
      } finally {
        await c.close();
      }
    } finally {
      await q.kill();
      await g?.close();
    }
  });
});
