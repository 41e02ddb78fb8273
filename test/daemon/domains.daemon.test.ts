/**
 * Every RAPL domain over v2, end to end: the daemon (child process) on a fake host of two packages
 * whose MSR files count package, core (PP0), DRAM and PSYS energy at known rates, and a fake QEMU with
 * one vCPU bound to each package's CPU (vpkg g on package g). A client that asks gets each domain per
 * vpkg and per host package; an old client's frames keep their bytes; watch and stats show the domains.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { V2Client } from '../../src/client/v2-client.js';
import { type HostUpdate, type Update } from '../../src/client/v2-replies.js';
import { runStats } from '../../src/cli/commands/stats.js';
import { runWatch } from '../../src/cli/commands/watch.js';
import { domainUnitJ } from '../../src/energy/msr-domains.js';
import { readCpuModel } from '../../src/msr/vendor.js';
import { MSR_DRAM_ENERGY_STATUS, MSR_PLATFORM_ENERGY_STATUS, MSR_PP0_ENERGY_STATUS } from '../../src/msr/registers.js';
import { HELPER_TYPES, T } from '../../src/protocol/v2/codec.js';
import { FrameDecoder, type Frame } from '../../src/protocol/v2/frame-decoder.js';
import { joulesPerCounterUnit } from '../../src/ratio/counter.js';
import { FakeHost } from '../support/fake-host.js';
import { FakeQemu } from '../support/fake-qemu.js';
import { which } from '../support/env.js';
import { hostArgs, spawnHelper, tempDir, waitFor } from './support/daemon-process.js';
import { RawClient } from '../v2/harness.js';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const POWER_UNIT = 0xa0e03n; // ESU 14: 61 µJ
const PUMP_MS = 20;
/** Counter units added every PUMP_MS, per package (index = package). */
const RATE = { package: [1200, 900], core: [700, 400], dram: [300, 250] };

/** What the daemon's MSR source makes of a domain's counts on this machine's CPU model (msr-domains.ts). */
function unitJ(domain: 'package' | 'core' | 'dram' | 'psys'): number {
  const esu = joulesPerCounterUnit(POWER_UNIT);
  return domain === 'package' ? esu : domainUnitJ('intel', domain, esu, readCpuModel('/proc'));
}

/** The daemon on the fake host, its counters pumped; PSYS about 30 W whatever its unit. */
async function domainDaemon() {
  const fake = new FakeHost({ packages: [0, 1] });
  cleanups.push(() => fake.cleanup());
  fake.writeRapl({ powerUnit: POWER_UNIT, energy: { 0: 1000, 1: 1000 } });
  for (const pkg of [0, 1]) for (const msr of [MSR_PP0_ENERGY_STATUS, MSR_DRAM_ENERGY_STATUS]) fake.setCounter(fake.cpusOf(pkg), msr, 1000);
  fake.setCounter(fake.cpusOf(0), MSR_PLATFORM_ENERGY_STATUS, 1000);
  const psysUnits = Math.max(1, Math.round((30 * PUMP_MS) / 1000 / unitJ('psys')));
  const pump = setInterval(() => {
    for (const pkg of [0, 1]) {
      fake.addEnergy(pkg, RATE.package[pkg]!);
      fake.addCounter(fake.cpusOf(pkg), MSR_PP0_ENERGY_STATUS, RATE.core[pkg]!);
      fake.addCounter(fake.cpusOf(pkg), MSR_DRAM_ENERGY_STATUS, RATE.dram[pkg]!);
    }
    fake.addCounter(fake.cpusOf(0), MSR_PLATFORM_ENERGY_STATUS, psysUnits);
  }, PUMP_MS);
  cleanups.push(() => clearInterval(pump));
  const dir = tempDir('vmsr-domains-daemon-');
  cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
  const sock = path.join(dir, 'helper.sock');
  const helper = spawnHelper(['-k', sock, ...hostArgs(fake), '--interval', '0.1', '--no-discovery']);
  cleanups.push(() => helper.stop('SIGKILL'));
  await waitFor(() => helper.stderr().includes('"msg":"Listening on'), 'the helper to listen', helper);
  return { sock, helper };
}

/** A fake QEMU whose vCPU g runs on CPU g (package g), both spinning. */
async function pinnedVm(): Promise<{ qemu: FakeQemu; vcpus: { tid: number; vpkg: number }[] }> {
  const qemu = await new FakeQemu({ vcpus: 2 }).ready();
  cleanups.push(() => qemu.kill());
  const vcpus = [0, 1].map((g) => ({ tid: qemu.vcpuTids.get(g)!, vpkg: g }));
  for (const v of vcpus) execFileSync('taskset', ['-p', '-c', String(v.vpkg), String(v.tid)], { stdio: 'ignore' });
  await qemu.cmd('spin 0');
  await qemu.cmd('spin 1');
  return { qemu, vcpus };
}

const domainOf = (u: Update, d: string) => u.domains!.find((x) => x.domain === d)!.vpkgEnergyUj;
const hostDomain = (h: HostUpdate, pkg: number, d: string) => h.domains!.find((x) => x.pkg === pkg && x.domain === d)!;

/** The frames of an old client's bytes, each checked against the layout it knew: no flag but ENDED / VMS_CHANGED, exact sizes. */
function oldLayout(bytes: Buffer): { updates: { tNs: bigint; energyUj: bigint[] }[]; hosts: number } {
  const frames: Frame[] = new FrameDecoder(HELPER_TYPES).push(bytes).map((f) => {
    if (!f.ok) throw new Error(f.error.message);
    return f.value;
  });
  const updates: { tNs: bigint; energyUj: bigint[] }[] = [];
  let hosts = 0;
  for (const f of frames) {
    expect(f.flags & ~0x1, `flags of ${f.type}`).toBe(0);
    const p = f.payload;
    if (f.type === T.UPDATE) {
      // u32 vm_id, u32 n, u64 t_ns, n x {u64 counter, u64 energy_uj}
      const n = p.readUInt32LE(4);
      expect(p.length).toBe(16 + 16 * n);
      updates.push({ tNs: p.readBigUInt64LE(8), energyUj: Array.from({ length: n }, (_, i) => p.readBigUInt64LE(24 + 16 * i)) });
    } else if (f.type === T.HOST_UPDATE) {
      expect(p.length).toBe(80 + 16 * p.readUInt32LE(72));
      hosts++;
    } else throw new Error(`unexpected frame type ${f.type}`);
  }
  return { updates, hosts };
}

describe('other RAPL domains on the daemon', () => {
  it('a client that asks gets per-domain energy per vpkg and per host package matching the fake energy, an old client the old bytes, watch and stats the domains', async (ctx) => {
    if (!which('taskset')) return ctx.skip('taskset not installed (util-linux)');
    if (os.availableParallelism() < 2) return ctx.skip(`needs CPUs 0 and 1 (this machine has ${os.availableParallelism()})`);
    const { sock, helper } = await domainDaemon();
    expect(helper.stderr()).toMatch(/package 0x611 .*core 0x639 .*dram 0x619 .*psys 0x64d/);
    const { qemu, vcpus } = await pinnedVm();

    const c = await V2Client.connect(sock);
    cleanups.push(() => c.close());
    const reg = await c.register({ pid: qemu.pid, vcpus });
    const vm = new Map<bigint, Update>();
    const ack = await c.subscribe(reg.vmId, (u) => vm.set(u.tNs, u), undefined, { domains: true });
    expect(ack.domains?.map((d) => d.domain)).toEqual(['core', 'dram', 'psys']);
    const host: HostUpdate[] = [];
    await c.subscribeHost((u) => host.push(u), undefined, { domains: true });
    // An old client: OBSERVE and HOST_SUBSCRIBE as they were written before the domains, by hand.
    const old = await RawClient.connect(sock);
    cleanups.push(() => old.destroy());
    const observe = Buffer.alloc(12);
    observe.writeUInt16LE(T.OBSERVE, 0);
    observe.writeUInt32LE(4, 4);
    observe.writeUInt32LE(reg.vmId, 8);
    old.write(Buffer.concat([observe, Buffer.from([T.HOST_SUBSCRIBE, 0, 0, 0, 0, 0, 0, 0])]));
    await waitFor(() => host.length >= 16, '16 host updates', helper);

    // Per interval, per vpkg g (all of it from package g): the VM's share of the package's core and
    // DRAM energy is its share of the package energy, and each domain balances with its unattributed part.
    let checked = 0;
    for (let i = 0; i + 1 < host.length; i++) {
      const [h0, h1] = [host[i]!, host[i + 1]!];
      const [u0, u1] = [vm.get(h0.tNs), vm.get(h1.tNs)];
      if (!u0 || !u1 || u0.tNs === 0n || h1.tNs === h0.tNs) continue;
      for (const g of [0, 1]) {
        const dPkgHost = Number(h1.packages[g]!.energyUj - h0.packages[g]!.energyUj);
        const dPkgVm = Number(u1.vpkgs[g]!.energyUj - u0.vpkgs[g]!.energyUj);
        // The pump is a timer of this process, and may be held up on a machine this busy: no energy, nothing to share.
        if (dPkgHost === 0) continue;
        for (const d of ['core', 'dram']) {
          const [a, b] = [hostDomain(h0, g, d), hostDomain(h1, g, d)];
          const dHost = Number(b.energyUj - a.energyUj);
          const dUnattributed = Number(b.unattributedUj - a.unattributedUj);
          const dVm = Number(domainOf(u1, d)[g]! - domainOf(u0, d)[g]!);
          const want = (dPkgVm * dHost) / dPkgHost;
          expect(Math.abs(dVm - want), `vpkg ${g} ${d}: ${dVm} µJ, package share implies ${want}`).toBeLessThanOrEqual(4 + 0.002 * want);
          expect(Math.abs(dHost - dVm - dUnattributed), `package ${g} ${d} balance`).toBeLessThanOrEqual(3);
        }
      }
      // PSYS, one counter under package 0, shared across both packages' VMs.
      const [p0, p1] = [hostDomain(h0, 0, 'psys'), hostDomain(h1, 0, 'psys')];
      const dVm = domainOf(u1, 'psys').reduce((s, e, g) => s + Number(e - domainOf(u0, 'psys')[g]!), 0);
      expect(Math.abs(Number(p1.energyUj - p0.energyUj) - dVm - Number(p1.unattributedUj - p0.unattributedUj))).toBeLessThanOrEqual(4);
      checked++;
    }
    expect(checked).toBeGreaterThanOrEqual(8);

    // Over the run, what the fake counters imply: DRAM/package energy on each package is the pumped
    // ratio in joules, and so is the VM's (its DRAM share = its package share x that ratio).
    const last = host.at(-1)!;
    const lastVm = vm.get(last.tNs)!;
    expect(last.domains!.map((d) => `${d.pkg} ${d.domain}`)).toEqual(['0 core', '1 core', '0 dram', '1 dram', '0 psys']);
    for (const g of [0, 1]) {
      for (const d of ['core', 'dram'] as const) {
        const implied = (RATE[d][g]! * unitJ(d)) / (RATE.package[g]! * unitJ('package'));
        const hostRatio = Number(hostDomain(last, g, d).energyUj) / Number(last.packages[g]!.energyUj);
        // Within a pump step or two over the run: a read may fall between the pump's writes of two counters.
        expect(Math.abs(hostRatio / implied - 1), `package ${g} ${d}/package ${hostRatio} vs ${implied}`).toBeLessThan(0.03);
        const vmRatio = Number(domainOf(lastVm, d)[g]!) / Number(lastVm.vpkgs[g]!.energyUj);
        expect(Math.abs(vmRatio / implied - 1), `vpkg ${g} ${d}/package ${vmRatio} vs ${implied}`).toBeLessThan(0.03);
      }
      expect(lastVm.vpkgs[g]!.energyUj).toBeGreaterThan(0n);
    }
    expect(domainOf(lastVm, 'psys').every((e) => e > 0n)).toBe(true);

    // The old client's frames: its layouts, and the same package values the new client got.
    const before = oldLayout(old.received);
    expect(before.hosts).toBeGreaterThanOrEqual(10);
    let same = 0;
    for (const u of before.updates) {
      const n = vm.get(u.tNs);
      if (!n) continue;
      expect(u.energyUj).toEqual(n.vpkgs.map((v) => v.energyUj));
      same++;
    }
    expect(same).toBeGreaterThanOrEqual(10);

    // watch: a column per domain, and --json carries them.
    const lines: string[] = [];
    await runWatch({ socket: sock, vm: String(qemu.pid), count: 3 }, (l) => lines.push(l));
    const header = lines.find((l) => /^ +t /.test(l))!;
    expect(header).toMatch(/^ +t +vpkg0 W +vpkg0 J +vpkg1 W +vpkg1 J +core W +dram W +psys W$/);
    const rows = lines.slice(lines.indexOf(header) + 1);
    expect(rows).toHaveLength(3);
    for (const r of rows) {
      expect(r).toMatch(/^ +\d+\.\ds( +\d+\.\d\d +\d+\.\d{3}){2}( +\d+\.\d\d){3}$/);
      expect(r.length).toBe(header.length);
    }
    const json: string[] = [];
    await runWatch({ socket: sock, vm: String(qemu.pid), count: 3, json: true }, (l) => json.push(l));
    type Rec = { type: string; domains: { domain: string; power_w: number; energy_uj: string; vpkgs: { power_w: number }[] }[] };
    const recs = json.map((l) => JSON.parse(l) as Rec).filter((r) => r.type === 'update');
    expect(recs).toHaveLength(3);
    for (const rec of recs) {
      expect(rec.domains.map((d) => d.domain)).toEqual(['core', 'dram', 'psys']);
      for (const d of rec.domains) {
        expect(d.power_w).toBeGreaterThanOrEqual(0);
        expect(d.energy_uj).toMatch(/^\d+$/);
        expect(d.power_w).toBeCloseTo(d.vpkgs[0]!.power_w + d.vpkgs[1]!.power_w, 6);
      }
    }
    // The pump (a timer of this busy process) may miss an interval, not all three.
    for (const [i, d] of ['core', 'dram', 'psys'].entries())
      expect(Math.max(...recs.map((r) => r.domains[i]!.power_w)), d).toBeGreaterThan(0);

    // stats: the host's domains per package under the VM table.
    // Stopped at the second refresh's head: its lines still come out (the abort is seen after them).
    const table: string[] = [];
    const stop = new AbortController();
    let heads = 0;
    const onLine = (l: string) => {
      table.push(l);
      if (/^ +ID +NAME /.test(l) && ++heads === 2) stop.abort();
    };
    await runStats({ socket: sock, intervalS: 0.3 }, onLine, stop.signal);
    const second = table.slice(table.findLastIndex((l) => /^ +ID +NAME /.test(l)));
    const head = second.findIndex((l) => /^ +PKG +DOMAIN +POWER W +ENERGY J +UNATTRIBUTED J$/.test(l));
    expect(head).toBeGreaterThan(0);
    const domainLines = second.slice(head + 1);
    expect(domainLines.map((l) => l.trim().split(/ +/).slice(0, 2).join(' '))).toEqual(['0 core', '0 dram', '0 psys', '1 core', '1 dram']);
    // The second refresh has a power for each (the pattern below: a number, not "-").
    for (const l of domainLines) expect(l).toMatch(/^ +\d +\w+ +\d+\.\d\d +\d+\.\d{3} +\d+\.\d{3}$/);
    const js: string[] = [];
    await runStats({ socket: sock, intervalS: 0.3, once: true, json: true }, (l) => js.push(l));
    const hostRecs = js.map(
      (l) => JSON.parse(l) as { type: string; package?: number; domain?: string; energy_j?: number; unattributed_j?: number },
    );
    expect(hostRecs.filter((r) => r.type === 'host_domain').map((r) => `${r.package} ${r.domain}`)).toEqual([
      '0 core',
      '0 dram',
      '0 psys',
      '1 core',
      '1 dram',
    ]);
    for (const r of hostRecs.filter((x) => x.type === 'host_domain')) expect(r.energy_j!).toBeGreaterThan(r.unattributed_j!);
  });
});
