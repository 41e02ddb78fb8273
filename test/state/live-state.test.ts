/**
 * The daemon's live state across a restart, with real parts: a v2 service on a real Unix socket, the
 * fake host's MSR files, the real /proc with fake QEMU processes (registered, discovered, one that dies
 * in the gap) and a registered `sleep`. The first service samples, is snapshotted and closed; the
 * snapshot goes through the codec and a sealed memfd; a second service on the same host starts from it.
 * Every sample both services took is recorded, and a ratio engine that never restarted replays them:
 * the restored service must publish what it publishes, to the µJ.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { V2Client } from '../../src/client/v2-client.js';
import { MsrDevice } from '../../src/msr/device.js';
import { MSR_DRAM_ENERGY_STATUS, MSR_PLATFORM_ENERGY_STATUS } from '../../src/msr/registers.js';
import { closeFd } from '../../src/os/libc/fds.js';
import { readStarttime } from '../../src/os/proc-starttime.js';
import { RatioEngine } from '../../src/ratio/attribution.js';
import type { HostInfo } from '../../src/model/host.js';
import type { Sample } from '../../src/model/sample.js';
import type { VmSpec } from '../../src/model/vm.js';
import { MAX_RESTORE_GAP_NS, planRestore } from '../../src/helper/v2/live-state.js';
import type { TraceSink } from '../../src/sampling/sampling-service.js';
import { DEFAULT_V2_LIMITS } from '../../src/helper/v2/v2-limits.js';
import { decodeState, encodeState } from '../../src/state/snapshot-codec.js';
import { readStateBytes, writeStateMemfd } from '../../src/state/memfd.js';
import type { StateSnapshot, VmState } from '../../src/state/snapshot.js';
import { assembleOnFakeHost, FakeHost, type Chain } from '../support/fake-host.js';
import { FakeQemu } from '../support/fake-qemu.js';
import { startChild, until, type TestChild } from '../v2/harness.js';

const POWER_UNIT = 0xa0e03n; // ESU 14
const UNIT_J = 2 ** -14;
/** Package energy added while no service runs: the gap the restored service's first interval spans. */
const GAP_UNITS = 400_000;

/** Every registration and sample of both services, in order: what a never-restarted engine replays. */
class Recorder implements TraceSink {
  readonly events: (
    | { kind: 'register'; vm: VmSpec }
    | { kind: 'sample'; s: Sample }
    | { kind: 'unregister'; pid: number }
    | { kind: 'vcpus'; vmId: number; vcpus: VmSpec['vcpus'] }
  )[] = [];
  register(_t: bigint, vm: VmSpec): void {
    this.events.push({ kind: 'register', vm });
  }
  sample(s: Sample): void {
    this.events.push({ kind: 'sample', s });
  }
  unregister(_t: bigint, pid: number): void {
    this.events.push({ kind: 'unregister', pid });
  }

  /** The engine that saw all of it, never stopping. */
  replay(host: ConstructorParameters<typeof RatioEngine>[0]): RatioEngine {
    const engine = new RatioEngine(host);
    const byPid = new Map<number, number>();
    for (const e of this.events) {
      if (e.kind === 'register') byPid.set(e.vm.pid, engine.register(e.vm));
      else if (e.kind === 'sample') engine.addSample(e.s);
      else if (e.kind === 'vcpus') engine.updateVcpus(e.vmId, e.vcpus);
      else {
        const id = byPid.get(e.pid);
        if (id === undefined) continue;
        engine.unregister(id);
        engine.forget(id);
      }
    }
    return engine;
  }
}

const log = pino({ level: process.env.V2_TEST_LOG ?? 'silent' });
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-state-'));
const started: Chain[] = [];
const hosts: FakeHost[] = [];
const devices: MsrDevice[] = [];
const procs: FakeQemu[] = [];
const children: TestChild[] = [];
const clients: V2Client[] = [];

function start(
  fake: FakeHost,
  device: MsrDevice,
  o: { name: string; intervalMs: number; trace?: TraceSink; restore?: StateSnapshot; restoreWaitMs?: number; discovery?: boolean },
): Promise<Chain> {
  return assembleOnFakeHost(fake, device, {
    socketPath: path.join(dir, `${o.name}.sock`),
    intervalMs: o.intervalMs,
    limits: DEFAULT_V2_LIMITS,
    log,
    discovery: o.discovery ?? true,
    ...(o.trace ? { trace: o.trace } : {}),
    ...(o.restore ? { restore: o.restore } : {}),
    ...(o.restoreWaitMs !== undefined ? { restoreWaitMs: o.restoreWaitMs } : {}),
  }).then((c) => (started.push(c), c));
}

/** DRAM energy while the pump runs, and during the restart gap, per package-energy unit (an arbitrary ratio the shares must keep). */
const DRAM_PER_PKG_UNIT = 0.25;

function fakeHost(packages: number[], withDomains = false): { fake: FakeHost; device: MsrDevice } {
  const fake = new FakeHost({ packages });
  fake.writeRapl({ powerUnit: POWER_UNIT, energy: Object.fromEntries(packages.map((p) => [p, 0xfff00000])) }); // wraps early
  // DRAM (and psys) counting: the engine attributes them beside the package, and the snapshot carries them.
  if (withDomains) for (const msr of [MSR_DRAM_ENERGY_STATUS, MSR_PLATFORM_ENERGY_STATUS]) fake.setCounter(fake.cpusOf(0), msr, 0xffff0000);
  const device = new MsrDevice(fake.msrPathTemplate);
  hosts.push(fake);
  devices.push(device);
  return { fake, device };
}

async function fakeQemu(o: ConstructorParameters<typeof FakeQemu>[0]): Promise<FakeQemu> {
  const q = new FakeQemu(o);
  procs.push(q);
  return q.ready();
}

const vmOf = (s: StateSnapshot, pid: number): VmState => {
  const vm = s.vms.find((v) => v.pid === pid);
  if (!vm) throw new Error(`no VM of pid ${pid} in the snapshot`);
  return vm;
};

/** What a VM is expected to look like after a restore: ended when its process did not survive. */
const afterRestore = (vm: VmState): VmState =>
  readStarttime('/proc', vm.pid) === vm.starttime || !vm.live ? vm : { ...vm, live: false, baseline: false };
const byPid = (a: { pid: number }, b: { pid: number }) => a.pid - b.pid;

let host: { fake: FakeHost; device: MsrDevice };
const rec = new Recorder();
let saved: StateSnapshot;
let hostInfo: HostInfo;
let registered: FakeQemu;
let discovered: FakeQemu;
let dying: FakeQemu;
let sleeper: TestChild;

beforeAll(async () => {
  host = fakeHost([0, 0], true);
  const a = await start(host.fake, host.device, { name: 'before', intervalMs: 100, trace: rec });
  hostInfo = a.host;
  registered = await fakeQemu({ vcpus: 2, args: ['-name', 'reg-vm', '-smp', '2,sockets=2'] });
  discovered = await fakeQemu({ vcpus: 2, args: ['-name', 'disc-vm', '-smp', '2,maxcpus=4,sockets=2'] });
  dying = await fakeQemu({ vcpus: 1, args: ['-name', 'dying'] });
  sleeper = startChild('sleep');
  children.push(sleeper);
  await registered.cmd('spin 1');
  const c = await V2Client.connect(path.join(dir, 'before.sock'));
  clients.push(c);
  // The client's vCPU list is the one discovery finds (CPU n/KVM, -smp 2,sockets=2), so the replay, which
  // sees registrations and not vCPU list changes, counts the same threads.
  const tids = registered.vcpuTids;
  await c.register({
    pid: registered.pid,
    vcpus: [
      { tid: tids.get(0)!, vpkg: 0 },
      { tid: tids.get(1)!, vpkg: 1 },
    ],
  });
  await c.register({ pid: sleeper.pid, vcpus: [{ tid: sleeper.pid, vpkg: 0 }] });
  const pump = setInterval(() => {
    host.fake.addEnergy(0, 3000);
    host.fake.addCounter(host.fake.cpusOf(0), MSR_DRAM_ENERGY_STATUS, 3000 * DRAM_PER_PKG_UNIT);
    host.fake.addCounter(host.fake.cpusOf(0), MSR_PLATFORM_ENERGY_STATUS, 6000);
  }, 20);
  const known = (pid: number) => a.service.snapshot().vms.some((v) => v.pid === pid && v.live && v.baseline && v.valuesNs > 0n);
  await until(
    () => [registered, discovered, dying].every((q) => known(q.pid)) && known(sleeper.pid),
    10_000,
    'every VM through an interval',
  );
  const n = a.service.stats.samples;
  await until(() => a.service.stats.samples >= n + 2, 5000, 'two more samples');
  clearInterval(pump);
  // One more sample after the last energy: the saved last sample has the counter the gap starts from.
  const m = a.service.stats.samples;
  await until(() => a.service.stats.samples >= m + 1, 5000, 'a sample after the pump stopped');
  saved = a.service.snapshot();
  await a.close();
}, 30_000);

afterAll(async () => {
  for (const c of clients.splice(0)) await c.close().catch(() => {});
  for (const c of started.splice(0)) await c.close();
  for (const q of procs.splice(0)) await q.kill();
  for (const ch of children.splice(0)) await ch.kill();
  for (const d of devices.splice(0)) d.close();
  for (const f of hosts.splice(0)) f.cleanup();
  fs.rmSync(dir, { recursive: true, force: true });
});

describe('live state across a restart', () => {
  it('a restored service keeps ids, names, registrations and totals, and attributes the restart gap as if no restart happened', async () => {
    // Through the codec, then through a sealed memfd, as a re-exec would hand it over.
    const decoded = decodeState(encodeState(saved));
    if (!decoded.ok) throw new Error(decoded.error);
    expect(decoded.value).toEqual(saved);
    const fd = writeStateMemfd(decoded.value);
    let handed: StateSnapshot;
    try {
      const r = decodeState(readStateBytes(fd));
      if (!r.ok) throw new Error(r.error);
      handed = r.value;
    } finally {
      closeFd(fd);
    }
    expect(handed).toEqual(saved);

    // The gap: energy goes on, the registered VM's vCPU spins on, one VM's process dies, the discovered
    // VM gains a busy vCPU in its second virtual package (CPU 2 of -smp 2,maxcpus=4,sockets=2).
    host.fake.addEnergy(0, GAP_UNITS);
    host.fake.addCounter(host.fake.cpusOf(0), MSR_DRAM_ENERGY_STATUS, GAP_UNITS * DRAM_PER_PKG_UNIT);
    await dying.kill();
    await discovered.cmd('add 2');
    await discovered.cmd('spin 2');
    const hotplugged = discovered.vcpuTids.get(2)!;
    await new Promise((r) => setTimeout(r, 300));

    const b = await start(host.fake, host.device, { name: 'after', intervalMs: 60_000, trace: rec, restore: handed, restoreWaitMs: 1500 });
    const restored = b.service.snapshot();
    const why = b.service.restored;
    if (why === null || !why.ok) throw new Error(`not restored: ${why === null ? 'no restore' : why.error}`);
    expect(why.value.rebaseline).toBeNull();
    expect(why.value.ended).toContainEqual({ hostVmId: vmOf(saved, dying.pid).hostVmId, pid: dying.pid, why: 'its process is gone' });
    // Before its first sample: ids, names, owners, totals to the µJ, the last sample, as saved; the dead VM ended.
    const grownVm = vmOf(saved, discovered.pid);
    const vms = saved.vms.map(afterRestore).map((v) =>
      v !== grownVm
        ? v
        : {
            ...v,
            vcpus: [...v.vcpus, { tid: hotplugged, vpkg: 1 }].sort((x, y) => x.tid - y.tid),
            vpkgs: [...v.vpkgs, { energyJ: 0, energyUj: 0n, counter: 0n }],
          },
    );
    expect(grownVm.vpkgs).toHaveLength(1);
    // The engine that never restarted learns of the new vCPU when the restored service does: before its first sample.
    rec.events.push({ kind: 'vcpus', vmId: grownVm.hostVmId, vcpus: vmOf(restored, discovered.pid).vcpus });
    const sampled = new Set(vms.filter((v) => v.live).map((v) => v.pid));
    expect(saved.domains?.vms.map((d) => d.domain)).toContain('dram');
    const domains = {
      ...saved.domains!,
      // The grown VM's new virtual package starts at 0 in every domain too.
      vms: saved.domains!.vms.map((d) => (d.hostVmId === grownVm.hostVmId ? { ...d, energyJ: [...d.energyJ, 0] } : d)),
    };
    expect({ ...restored, knownPids: [...restored.knownPids].sort(byPid) }).toEqual({
      ...saved,
      domains,
      vms,
      knownPids: [...saved.knownPids].sort(byPid),
      // The thread marks of a VM that ended are not kept (the engine keeps none for it).
      lastSample: { ...saved.lastSample!, threads: saved.lastSample!.threads.filter((t) => sampled.has(t.pid)) },
    });
    expect(vmOf(restored, dying.pid)).toMatchObject({ live: false, baseline: false });
    expect(vmOf(restored, registered.pid).owner).toBe(vmOf(saved, registered.pid).owner);

    await until(() => b.service.stats.samples >= 1, 5000, 'the first sample after the restart');
    const after = b.service.snapshot();

    // The gap's energy, whole, in the host's total: no counter unit lost across the restart.
    expect(after.packages[0]!.energyJ).toBe(saved.packages[0]!.energyJ + GAP_UNITS * UNIT_J);
    // The same for DRAM, in its own totals.
    const dramOf = (x: StateSnapshot) => x.domains!.packages.find((k) => k.pkg === 0 && k.domain === 'dram')!.energyJ;
    expect(dramOf(after)).toBeCloseTo(dramOf(saved) + GAP_UNITS * DRAM_PER_PKG_UNIT * UNIT_J, 9);
    // Each VM as an engine that saw every sample and never restarted publishes it.
    const reference = rec.replay(b.host);
    let grown = 0;
    for (const vm of after.vms) {
      const ref = reference.output(vm.hostVmId);
      expect(ref, `VM ${vm.hostVmId}`).toBeDefined();
      expect(vm.vpkgs, `VM ${vm.hostVmId}`).toEqual(
        ref!.vpkgs.map((v) => ({ energyJ: v.energyJ, energyUj: v.energyUj, counter: BigInt(v.counter) })),
      );
      expect(vm.live).toBe(!ref!.ended);
      // Every other domain of the VM too: its totals as the engine that never restarted has them.
      for (const d of ref!.domains ?? [])
        expect(
          after.domains!.vms.find((x) => x.hostVmId === vm.hostVmId && x.domain === d.domain)?.energyJ,
          `VM ${vm.hostVmId} ${d.domain}`,
        ).toEqual(d.vpkgEnergyJ);
      const before = saved.vms.find((v) => v.hostVmId === vm.hostVmId);
      if (!before) continue;
      vm.vpkgs.forEach((v, g) => expect(v.energyUj >= (before.vpkgs[g]?.energyUj ?? 0n)).toBe(true));
      grown += vm.vpkgs.reduce((s, v) => s + v.energyJ, 0) - before.vpkgs.reduce((s, v) => s + v.energyJ, 0);
    }
    expect(grown).toBeLessThanOrEqual(GAP_UNITS * UNIT_J * (1 + 1e-12));
    // The spinning vCPU's share of the gap went to its virtual package.
    expect(vmOf(after, registered.pid).vpkgs[1]!.energyJ).toBeGreaterThan(vmOf(saved, registered.pid).vpkgs[1]!.energyJ);
    expect(vmOf(after, dying.pid).vpkgs).toEqual(vmOf(saved, dying.pid).vpkgs);
    // The vCPU born during the restart counts from the first interval: its virtual package got its share.
    expect(vmOf(after, discovered.pid).vpkgs[1]!.energyJ).toBeGreaterThan(0);

    // A REGISTER of the same process takes its restored registration over: same id, totals go on.
    const c = await V2Client.connect(path.join(dir, 'after.sock'));
    clients.push(c);
    const tids = registered.vcpuTids;
    const again = await c.register({
      pid: registered.pid,
      vcpus: [
        { tid: tids.get(0)!, vpkg: 0 },
        { tid: tids.get(1)!, vpkg: 1 },
      ],
    });
    expect(again.vmId).toBe(vmOf(saved, registered.pid).hostVmId);
    const taken = vmOf(b.service.snapshot(), registered.pid);
    expect(taken.owner).not.toBe(vmOf(saved, registered.pid).owner);
    expect(taken.vpkgs).toEqual(vmOf(after, registered.pid).vpkgs);

    // The sleeper's registration is not taken over: released once the wait is over, as a closed connection's.
    expect(vmOf(b.service.snapshot(), sleeper.pid).owner).toBe(vmOf(saved, sleeper.pid).owner);
    await until(() => !b.service.snapshot().vms.some((v) => v.pid === sleeper.pid), 5000, 'the sleeper released');
    expect(vmOf(b.service.snapshot(), registered.pid).owner).toBe(taken.owner);
    // A new VM gets an id past every restored one.
    expect(b.service.snapshot().nextHostVmId).toBeGreaterThanOrEqual(saved.nextHostVmId);
  }, 30_000);

  it('a snapshot of another host is refused and the service starts fresh', async () => {
    const other = fakeHost([0, 1]);
    const s = await start(other.fake, other.device, { name: 'other', intervalMs: 60_000, restore: saved, discovery: false });
    const why = s.service.restored;
    expect(why?.ok).toBe(false);
    expect(why && !why.ok && why.error).toMatch(
      /^cannot restore state: it was saved on a host with packages 0, this host has packages 0,1; the daemon starts without it/,
    );
    expect(s.service.snapshot()).toMatchObject({ nextHostVmId: 1, vms: [], lastSample: null });
    // No VM known: none registered, discovered or ended (every record of the registry is in the snapshot).
    expect(s.service.snapshot().vms).toEqual([]);
  });

  it("a snapshot whose counters do not follow from its energy at this host's unit is refused and the service starts fresh", async () => {
    const bad = structuredClone(saved);
    const vm = vmOf(bad, discovered.pid);
    vm.vpkgs[0]!.counter = (vm.vpkgs[0]!.counter + 1n) % (1n << 32n);
    const s = await start(host.fake, host.device, { name: 'bad', intervalMs: 60_000, restore: bad, discovery: false });
    const why = s.service.restored;
    expect(why && !why.ok && why.error).toMatch(
      new RegExp(`^cannot restore state: VM ${vm.hostVmId}, virtual package 0: counter \\d+ does not follow from`),
    );
    // No VM known: none registered, discovered or ended (every record of the registry is in the snapshot).
    expect(s.service.snapshot().vms).toEqual([]);
  });

  it('a restart gap longer than MAX_RESTORE_GAP_NS keeps the totals but is not attributed, and a last sample from the future is refused', () => {
    const last = saved.lastSample!.monotonicNs;
    const alive = { starttime: (pid: number) => readStarttime('/proc', pid) };
    const late = planRestore(saved, hostInfo, { ...alive, nowNs: last + MAX_RESTORE_GAP_NS + 1n });
    if (!late.ok) throw new Error(late.error);
    expect(late.value.rebaseline).toMatch(/^the last sample is 60000 ms old, over 60000 ms/);
    expect(late.value.sampling.engine.lastSample).toBeNull();
    const live = late.value.sampling.engine.vms.filter((v) => v.phase !== 'ended');
    expect(live.length).toBeGreaterThan(0);
    for (const v of live) expect(v).toMatchObject({ phase: 'pending', prev: [] });
    for (const v of late.value.sampling.engine.vms)
      expect(v.accJ).toEqual(saved.vms.find((s) => s.hostVmId === v.id)!.vpkgs.map((g) => g.energyJ));
    const inTime = planRestore(saved, hostInfo, { ...alive, nowNs: last + MAX_RESTORE_GAP_NS });
    expect(inTime.ok && inTime.value.rebaseline).toBeNull();
    const rebooted = planRestore(saved, hostInfo, { ...alive, nowNs: last - 1n });
    expect(!rebooted.ok && rebooted.error).toMatch(
      /^cannot restore state: its last sample \(\d+ ns\) is later than now \(\d+ ns\) on the monotonic clock: the host rebooted since;/,
    );
  });
});
