/**
 * Discovery of real QEMU processes (qemu-system-x86_64 running the spin guest), in the v2 service on
 * the real /proc; package energy from FakeHost's MSR files.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { V2Client } from '../../src/client/v2-client.js';
import { type VmInfo, type VmUpdate } from '../../src/client/v2-replies.js';
import { MSR_DRAM_ENERGY_STATUS } from '../../src/msr/registers.js';
import { startHarness, until, type Harness } from '../v2/harness.js';
import { qemuMissing, startQemu, waitSettled, type QemuGuest } from '../support/qemu.js';

const why = qemuMissing();
if (why) console.log(`skipping discovery of real QEMU: ${why}`);

/** The VM of `pid` once LIST shows it as `ok` wants; the deadline is far above the few samples it takes. */
async function listed(c: V2Client, pid: number, ok: (v: VmInfo) => boolean = () => true, timeoutMs = 60_000): Promise<VmInfo> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const vm = (await c.list()).find((v) => v.pid === pid && !v.ended && ok(v));
    if (vm) return vm;
    await new Promise((r) => setTimeout(r, 50));
  }
  const seen = (await c.list()).find((v) => v.pid === pid);
  throw new Error(
    `pid ${pid} not listed as expected within ${timeoutMs} ms; last listed as ${JSON.stringify(seen, (_k, v: unknown) => (typeof v === 'bigint' ? String(v) : v))}`,
  );
}

describe.skipIf(why !== null)('discovery of real QEMU', () => {
  let h: Harness;
  let pump: NodeJS.Timeout;
  let c: V2Client;
  const guests: QemuGuest[] = [];

  beforeAll(async () => {
    h = await startHarness({ intervalMs: 100, discovery: true });
    pump = setInterval(() => h.addEnergy(2000), 20);
    c = await V2Client.connect(h.socketPath);
  });
  afterAll(async () => {
    clearInterval(pump);
    await c?.close();
    for (const g of guests) await g.stop();
    await h?.close();
  });

  it('plain QEMU (no -name, no debug-threads): discovered with no name, one virtual package holding the whole VM, flagged wholeVmOnly', async () => {
    const g = await startQemu({ mode: 'b', smp: 2, sockets: 2, plain: true, extraArgs: ['-uuid', '6f1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d'] });
    guests.push(g);
    const vm = await listed(c, g.pid);
    expect(vm).toMatchObject({
      name: null,
      uuid: '6f1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d',
      source: 'discovered',
      wholeVmOnly: true,
      nvpkg: 1,
    });
    let last: VmUpdate | undefined;
    await c.observe(vm.hostVmId, (u) => (last = u));
    await until(() => last !== undefined && Number(last.vpkgs[0]!.energyUj) > 100_000, 60_000, 'whole-VM energy');
    expect(last!.vpkgs).toHaveLength(1);
    await g.stop();
  }, 120_000);

  it('QEMU with debug-threads: per-vpkg energy follows the guest (mode p: vCPU 1, socket 1, spins)', async () => {
    const g = await startQemu({ mode: 'p', smp: 2, sockets: 2, name: 'qemu-p' });
    guests.push(g);
    // Seen while QEMU was still naming its threads, it starts whole-VM and is split once they are named
    // (a virtual package for each guest socket a named vCPU thread is in: on a loaded machine the
    // second may be named a sample after the first).
    const vm = await listed(c, g.pid, (v) => !v.wholeVmOnly && v.nvpkg === 2);
    expect(vm).toMatchObject({ name: 'qemu-p', uuid: null, wholeVmOnly: false, nvpkg: 2 });
    expect(await waitSettled(g, 'p')).toBe(true);
    let first: VmUpdate | undefined;
    let last: VmUpdate | undefined;
    await c.observe(vm.hostVmId, (u) => {
      first ??= u;
      last = u;
    });
    await until(() => last !== undefined && Number(last.vpkgs[1]!.energyUj - first!.vpkgs[1]!.energyUj) > 300_000, 60_000, 'vpkg 1 energy');
    const d0 = Number(last!.vpkgs[0]!.energyUj - first!.vpkgs[0]!.energyUj);
    const d1 = Number(last!.vpkgs[1]!.energyUj - first!.vpkgs[1]!.energyUj);
    expect(d1).toBeGreaterThan(5 * d0);
  }, 180_000);
});

describe.skipIf(why !== null)('discovery of real QEMU on a host with other RAPL domains', () => {
  /** DRAM counts this share of each package count, in the same unit (the ESU: no fixed DRAM unit on this CPU model). */
  const DRAM_SHARE = 0.25;
  let h: Harness;
  let pump: NodeJS.Timeout;
  let c: V2Client;
  let g: QemuGuest | undefined;

  beforeAll(async () => {
    h = await startHarness({ intervalMs: 100, discovery: true, domainMsrs: [MSR_DRAM_ENERGY_STATUS] });
    pump = setInterval(() => {
      h.addEnergy(2000);
      h.fake.addCounter(h.fake.cpusOf(0), MSR_DRAM_ENERGY_STATUS, 2000 * DRAM_SHARE);
    }, 20);
    c = await V2Client.connect(h.socketPath);
  });
  afterAll(async () => {
    clearInterval(pump);
    await c?.close();
    await g?.stop();
    await h?.close();
  });

  it('a discovered QEMU gets its DRAM energy per virtual package in the share of its package energy', async () => {
    g = await startQemu({ mode: 'p', smp: 2, sockets: 2, name: 'qemu-dram' });
    const vm = await listed(c, g.pid, (v) => !v.wholeVmOnly);
    expect(await waitSettled(g, 'p')).toBe(true);
    let first: VmUpdate | undefined;
    let last: VmUpdate | undefined;
    await c.observe(
      vm.hostVmId,
      (u) => {
        first ??= u;
        last = u;
      },
      undefined,
      { domains: true },
    );
    await until(
      () => last !== undefined && Number(last.vpkgs[1]!.energyUj - first!.vpkgs[1]!.energyUj) > 1_000_000,
      60_000,
      'vpkg 1 energy',
    );
    const dram = (u: VmUpdate) => u.domains!.find((d) => d.domain === 'dram')!.vpkgEnergyUj;
    expect(last!.domains!.map((d) => d.domain)).toEqual(['dram']);
    // Over many intervals, each vpkg's DRAM energy is its package energy times the counters' ratio (a
    // sample that falls between the pump's two writes moves a little of it to the next interval).
    for (const g2 of [0, 1]) {
      const pkg = Number(last!.vpkgs[g2]!.energyUj - first!.vpkgs[g2]!.energyUj);
      const dr = Number(dram(last!)[g2]! - dram(first!)[g2]!);
      if (pkg < 100_000) continue; // the idle vCPU's vpkg: too little to compare
      expect(dr / pkg).toBeGreaterThan(DRAM_SHARE * 0.9);
      expect(dr / pkg).toBeLessThan(DRAM_SHARE * 1.1);
    }
  }, 180_000);
});
