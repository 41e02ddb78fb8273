import fs from 'node:fs';
import path from 'node:path';
import { execFile, spawn } from 'node:child_process';
import os from 'node:os';
import { BIN, ensureBuilt } from '../daemon/support/daemon-process.js';
import { afterEach, describe, expect, it } from 'vitest';
import { V2Client } from '../../src/client/v2-client.js';
import { type HostUpdate, type Update } from '../../src/client/v2-replies.js';
import { TraceWriter } from '../../src/trace/writer.js';
import { replayFile } from '../../src/trace/reader.js';
import { stateOf } from '../../src/ratio/replay-report.js';
import { domainPowers, formatHeader, formatJsonUpdate, formatUpdate, powers, runWatch } from '../../src/cli/commands/watch.js';
import { formatHostDomainTable, hostDomainRows } from '../../src/cli/commands/stats.js';
import { startChild, startHarness, until, untilNoClients } from './harness.js';
import { hostStats } from '../support/helper-messages.js';

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** A v2 service harness whose samples go to a trace file (opened once the harness knows its host). */
async function recordingHarness() {
  const tmp = fs.mkdtempSync('/tmp/vmsr-v2trace-');
  cleanups.push(() => fs.rmSync(tmp, { recursive: true, force: true }));
  const tracePath = path.join(tmp, 'live.jsonl');
  let trace: TraceWriter | undefined = undefined;
  // The header needs the host; the harness reads it, so open the trace lazily through a proxy sink.
  const sink = {
    register: (t: bigint, vm: Parameters<TraceWriter['register']>[1]) => trace!.register(t, vm),
    sample: (s: Parameters<TraceWriter['sample']>[0]) => trace!.sample(s),
    unregister: (t: bigint, pid: number) => trace!.unregister(t, pid),
  };
  const h = await startHarness({ intervalMs: 25, trace: sink });
  cleanups.push(() => h.close());
  trace = TraceWriter.open(tracePath, { host: h.host, note: 'v2 service test' });
  return { h, trace, tracePath };
}

describe('trace recording by the v2 service', () => {
  it('a live run replays to the same published numbers', async () => {
    const { h, trace, tracePath } = await recordingHarness();
    const spin = startChild('spin');
    const sleep = startChild('sleep');
    cleanups.push(
      () => spin.kill(),
      () => sleep.kill(),
    );
    const pump = setInterval(() => h.addEnergy(30000), 5);
    cleanups.push(() => clearInterval(pump));

    const c = await V2Client.connect(h.socketPath);
    cleanups.push(() => c.close());
    const a = await c.register({ pid: spin.pid, vcpus: [{ tid: spin.pid, vpkg: 0 }] });
    const b = await c.register({ pid: sleep.pid, vcpus: [{ tid: sleep.pid, vpkg: 0 }] });
    const ua: Update[] = [];
    await c.subscribe(a.vmId, (u) => ua.push(u));
    await until(() => ua.length >= 12, 8000, 'updates');
    await sleep.kill(); // b ends (frozen) during the run
    await until(() => ua.length >= 18, 8000, 'more updates');
    // READs and UNREGISTERs written together: the helper handles them in one go, no sample between.
    const [va, vb] = await Promise.all([c.read(a.vmId, 0), c.read(b.vmId, 0), c.unregister(a.vmId), c.unregister(b.vmId)]);
    await trace.close();

    const summary = await replayFile(tracePath);
    const [ra, rb] = summary.vms.map((v) => v.output);
    expect(ra!.pid).toBe(spin.pid);
    expect(rb!.pid).toBe(sleep.pid);
    expect(ra!.ended && rb!.ended).toBe(true);
    // READ happened after the last sample before unregister: the replay's totals are those values.
    expect(ra!.vpkgs[0]!.energyUj).toBe(va!.energyUj);
    expect(BigInt(ra!.vpkgs[0]!.counter)).toBe(va!.counter);
    expect(rb!.vpkgs[0]!.energyUj).toBe(vb!.energyUj);
    expect(va!.energyUj).toBeGreaterThan(vb!.energyUj);
    expect(va!.energyUj).toBeGreaterThan(0n);
  });
});

describe('trace recording: names and unregistered VMs', () => {
  it("records the name on the VM's command line (QEMU -name) and replays an unregistered, still running VM as unregistered", async () => {
    const { h, trace, tracePath } = await recordingHarness();
    // A process whose command line carries a QEMU-style -name, as libvirt starts QEMU.
    const vm = spawn(process.execPath, ['-e', 'setInterval(() => {}, 1e6)', '--', '-name', 'guest=vm-live,debug-threads=on'], {
      stdio: 'ignore',
    });
    cleanups.push(() => void vm.kill('SIGKILL'));
    const c = await V2Client.connect(h.socketPath);
    cleanups.push(() => c.close());
    const reg = await c.register({ pid: vm.pid!, vcpus: [{ tid: vm.pid!, vpkg: 0 }] });
    const got: Update[] = [];
    await c.subscribe(reg.vmId, (u) => got.push(u));
    await until(() => got.length >= 4, 8000, 'updates');
    await c.unregister(reg.vmId);
    await trace.close();
    expect(vm.exitCode).toBeNull(); // still running when unregistered
    const summary = await replayFile(tracePath);
    expect(summary.header.hostname).toBe(os.hostname());
    expect(summary.vms.map((v) => [v.output.name, stateOf(v.output)])).toEqual([['vm-live', 'unregistered']]);
  });
});

/** runWatch on a spinning child registered with a harness whose energy keeps rising; its output lines. */
async function watchSpinner(o: { count: number; json?: boolean }) {
  const h = await startHarness({ intervalMs: 20 });
  cleanups.push(() => h.close());
  const spin = startChild('spin');
  cleanups.push(() => spin.kill());
  const pump = setInterval(() => h.addEnergy(10000), 5);
  cleanups.push(() => clearInterval(pump));
  const lines: string[] = [];
  await runWatch({ socket: h.socketPath, pid: spin.pid, vcpus: [{ tid: spin.pid, vpkg: 0 }], ...o }, (l) => lines.push(l));
  return { h, spin, lines };
}

describe('watch', () => {
  it('formats power from the energy delta over the time delta, under a header whose columns line up', () => {
    const a: Update = { vmId: 1, tNs: 1_000_000_000n, vpkgs: [{ counter: 0n, energyUj: 1_000_000n }], ended: false };
    const b: Update = { vmId: 1, tNs: 3_000_000_000n, vpkgs: [{ counter: 0n, energyUj: 21_000_000n }], ended: true };
    expect(formatUpdate(a, b)).toMatch(/ +10\.00 +21\.000 .*ended/);
    expect(formatUpdate(null, a)).toMatch(/^ +[\d.]+s +- +1\.000$/);
    // Time counts from the first sample watched, not the helper's monotonic clock; t_ns 0 is "-".
    expect(formatUpdate(a, b, a.tNs)).toMatch(/^ +2\.0s /);
    expect(formatUpdate(null, { ...a, tNs: 0n }, undefined)).toMatch(/^ +- /);
    const header = formatHeader(2);
    const row = formatUpdate(a, { ...b, vpkgs: [b.vpkgs[0]!, { counter: 0n, energyUj: 5_000_000n }], ended: false }, a.tNs);
    expect(header).toMatch(/^ +t +vpkg0 W +vpkg0 J +vpkg1 W +vpkg1 J$/);
    expect(header.length).toBe(row.length);
    // Each header label ends where its column's numbers end.
    for (const label of ['vpkg0 W', 'vpkg0 J', 'vpkg1 W', 'vpkg1 J']) {
      const end = header.indexOf(label) + label.length;
      expect(row[end - 1]).toMatch(/\d/);
      expect(row[end] ?? ' ').toBe(' ');
    }
  });

  it("shows a VM's guest energy against its exact energy after the row in exact mode, and nothing in raw mode", () => {
    const a: Update = { vmId: 1, tNs: 1_000_000_000n, vpkgs: [{ counter: 0n, energyUj: 1_000_000n }], ended: false };
    const b: Update = { vmId: 1, tNs: 3_000_000_000n, vpkgs: [{ counter: 0n, energyUj: 21_000_000n }], ended: false };
    const guest = { guestJ: 19.5, exactJ: 20, garbageWindows: 0, garbageJ: 0 };
    expect(formatUpdate(a, b, a.tNs, { guest, limit: null })).toBe(
      `${formatUpdate(a, b, a.tNs)}  guest 19.500 J of exact 20.000 J (0.9750)`,
    );
    expect(formatUpdate(a, b, a.tNs, { guest: null, limit: null })).toBe(formatUpdate(a, b, a.tNs));
    // Before QEMU was given anything there is no ratio to show.
    expect(formatUpdate(a, b, a.tNs, { guest: { ...guest, guestJ: 0, exactJ: 0 }, limit: null })).toBe(formatUpdate(a, b, a.tNs));
    // A guest QEMU gave garbage is named on the row.
    const poisoned = { ...guest, garbageWindows: 3, garbageJ: 1.5 };
    expect(formatUpdate(a, b, a.tNs, { guest: poisoned, limit: null })).toBe(
      `${formatUpdate(a, b, a.tNs, { guest, limit: null })}, GARBAGE in 3 windows (1.500 J)`,
    );
    expect(JSON.parse(formatJsonUpdate(a, b, a.tNs, undefined, { guest: poisoned, limit: null }))).toMatchObject({
      guest_garbage_windows: 3,
      guest_garbage_j: 1.5,
    });
    const json = JSON.parse(formatJsonUpdate(a, b, a.tNs, undefined, { guest, limit: null })) as Record<string, unknown>;
    expect(json).toMatchObject({ type: 'update', guest_energy_j: 19.5, guest_exact_energy_j: 20 });
    expect(formatJsonUpdate(a, b, a.tNs)).not.toContain('guest');
  });

  it("shows a VM's power limit after the row, throttled with its quota or ok, and the same in JSON; nothing without a limit", () => {
    const a: Update = { vmId: 1, tNs: 1_000_000_000n, vpkgs: [{ counter: 0n, energyUj: 1_000_000n }], ended: false };
    const b: Update = { vmId: 1, tNs: 3_000_000_000n, vpkgs: [{ counter: 0n, energyUj: 21_000_000n }], ended: false };
    const biting = { limits: [{ domain: 'package' as const, limitW: 21.5 }], quotaCpus: 0.482, limitedS: 33.4 };
    expect(formatUpdate(a, b, a.tNs, { guest: null, limit: biting })).toBe(
      `${formatUpdate(a, b, a.tNs)}  package limit 21.5 W throttled (quota 0.48 CPU, 33 s limited)`,
    );
    expect(formatUpdate(a, b, a.tNs, { guest: null, limit: { ...biting, quotaCpus: 0 } })).toBe(
      `${formatUpdate(a, b, a.tNs)}  package limit 21.5 W ok`,
    );
    const both = { ...biting, limits: [...biting.limits, { domain: 'dram' as const, limitW: 3 }] };
    expect(formatUpdate(a, b, a.tNs, { guest: null, limit: both })).toMatch(
      / {2}package limit 21.5 W, dram limit 3 W throttled \(quota 0.48 CPU/,
    );
    expect(JSON.parse(formatJsonUpdate(a, b, a.tNs, undefined, { guest: null, limit: both }))).toMatchObject({
      power_limits: { package: 21.5, dram: 3 },
    });
    const dramOnly = { ...biting, limits: [{ domain: 'dram' as const, limitW: 3 }] };
    expect(JSON.parse(formatJsonUpdate(a, b, a.tNs, undefined, { guest: null, limit: dramOnly }))).not.toHaveProperty('power_limit_w');
    expect(JSON.parse(formatJsonUpdate(a, b, a.tNs, undefined, { guest: null, limit: biting }))).toMatchObject({
      power_limits: { package: 21.5 },
      power_limit_w: 21.5,
      power_limit_state: 'throttled',
      power_limit_cpu_quota: 0.482,
      power_limited_s: 33.4,
    });
    expect(formatJsonUpdate(a, b, a.tNs, undefined, { guest: null, limit: null })).not.toContain('power_limit');
  });

  it('adds a power column per other RAPL domain, summed over vpkgs and lined up under its label, and none when the update has no domains', () => {
    const a: Update = {
      vmId: 1,
      tNs: 1_000_000_000n,
      ended: false,
      vpkgs: [
        { counter: 0n, energyUj: 1_000_000n },
        { counter: 0n, energyUj: 0n },
      ],
      domains: [
        { domain: 'dram', vpkgEnergyUj: [100_000n, 50_000n] },
        { domain: 'psys', vpkgEnergyUj: [2_000_000n, 0n] },
      ],
    };
    const b: Update = {
      ...a,
      tNs: 1_500_000_000n,
      domains: [
        { domain: 'dram', vpkgEnergyUj: [300_000n, 100_000n] },
        { domain: 'psys', vpkgEnergyUj: [4_000_000n, 1_000_000n] },
      ],
    };
    expect(domainPowers(a, b).map((d) => [d.domain, d.powerW, d.vpkgs.map((v) => v.powerW)])).toEqual([
      ['dram', 0.5, [0.4, 0.1]],
      ['psys', 6, [4, 2]],
    ]);
    // From the baseline (no domains yet) the whole energy is the interval's.
    expect(domainPowers({ tNs: 500_000_000n, vpkgs: [] }, a).map((d) => d.powerW)).toEqual([0.3, 4]);
    const header = formatHeader(2, ['dram', 'psys']);
    const row = formatUpdate(a, b, a.tNs);
    expect(header).toMatch(/vpkg1 J +dram W +psys W$/);
    expect(row).toMatch(/ +0\.50 +6\.00$/);
    expect(header.length).toBe(row.length);
    for (const label of ['dram W', 'psys W']) expect(row[header.indexOf(label) + label.length - 1]).toMatch(/\d/);
    const { domains: _d, ...plain } = b;
    expect(formatUpdate(a, plain, a.tNs)).toBe(formatUpdate(a, { ...b, domains: [] }, a.tNs));
    expect(formatHeader(2, [])).toBe(formatHeader(2));
    const json = JSON.parse(formatJsonUpdate(a, b, a.tNs)) as { domains: unknown };
    expect(json.domains).toEqual([
      {
        domain: 'dram',
        power_w: 0.5,
        energy_uj: '400000',
        vpkgs: [
          { vpkg: 0, power_w: 0.4, energy_uj: '300000' },
          { vpkg: 1, power_w: 0.1, energy_uj: '100000' },
        ],
      },
      {
        domain: 'psys',
        power_w: 6,
        energy_uj: '5000000',
        vpkgs: [
          { vpkg: 0, power_w: 4, energy_uj: '4000000' },
          { vpkg: 1, power_w: 2, energy_uj: '1000000' },
        ],
      },
    ]);
    expect(formatJsonUpdate(a, plain, a.tNs)).not.toContain('domains');
  });

  it("stats' host domain table: by package then domain, power from the previous refresh, nothing for a host without domains", () => {
    const h = (tNs: bigint, k: bigint): HostUpdate => ({
      tNs,
      packages: [],
      unattributedUj: 0n,
      vmsChanged: false,
      stats: hostStats(),
      domains: [
        { pkg: 0, domain: 'dram', energyUj: 1_000_000n * k, unattributedUj: 250_000n * k },
        { pkg: 1, domain: 'dram', energyUj: 2_000_000n * k, unattributedUj: 0n },
        { pkg: 0, domain: 'psys', energyUj: 9_000_000n * k, unattributedUj: 1_000_000n * k },
      ],
    });
    const rows = hostDomainRows(h(1_000_000_000n, 1n), h(3_000_000_000n, 2n));
    expect(rows).toEqual([
      { pkg: 0, domain: 'dram', powerW: 0.5, energyJ: 2, unattributedJ: 0.5 },
      { pkg: 0, domain: 'psys', powerW: 4.5, energyJ: 18, unattributedJ: 2 },
      { pkg: 1, domain: 'dram', powerW: 1, energyJ: 4, unattributedJ: 0 },
    ]);
    expect(hostDomainRows(null, h(3n, 1n)).map((r) => r.powerW)).toEqual([null, null, null]);
    const table = formatHostDomainTable(rows);
    expect(table[1]).toMatch(/^ +PKG +DOMAIN +POWER W +ENERGY J +UNATTRIBUTED J$/);
    expect(table[2]).toMatch(/^ +0 +dram +0\.50 +2\.000 +0\.500$/);
    expect(table.slice(1).every((l) => l.length === table[1]!.length)).toBe(true);
    expect(formatHostDomainTable(hostDomainRows(null, { ...h(3n, 1n), domains: [] }))).toEqual([]);
  });

  it('gives the first row a power, measured from the baseline (energy 0) to the first sample', () => {
    const base = { tNs: 500_000_000n, vpkgs: [] };
    const first: Update = { vmId: 1, tNs: 2_500_000_000n, vpkgs: [{ counter: 0n, energyUj: 30_000_000n }], ended: false };
    expect(powers(base, first)).toEqual([15]);
    expect(formatUpdate(base, first, first.tNs)).toMatch(/ +15\.00 +30\.000$/);
    expect(powers(null, first)).toEqual([null]);
  });

  it('--json gives one object per update: exact microjoules as strings, power in watts, t_ns as an integer', () => {
    const base = { tNs: 1_000_000_000n, vpkgs: [{ energyUj: 1_000_000n }] };
    const u: Update = { vmId: 3, tNs: 2n ** 60n, vpkgs: [{ counter: 0x1fn, energyUj: 2n ** 55n + 1n }], ended: true };
    const line = formatJsonUpdate(base, u, 2n ** 60n - 2_000_000_000n);
    const o = JSON.parse(line) as {
      type: string;
      vm_id: number;
      t_s: number;
      ended: boolean;
      vpkgs: { vpkg: number; energy_uj: string; counter: string; power_w: number }[];
    };
    expect(o).toMatchObject({ type: 'update', vm_id: 3, t_s: 2, ended: true });
    expect(o.vpkgs[0]).toMatchObject({ vpkg: 0, energy_uj: '36028797018963969', counter: '0x1f' });
    expect(line).toContain(`"t_ns":${2n ** 60n}`); // not rounded through a float
    expect(JSON.parse(formatJsonUpdate(null, { ...u, tNs: 0n }))).toMatchObject({ t_s: null, vpkgs: [{ power_w: null }] });
  });

  it('runWatch registers, prints a header and rows (power on the first), stops after --count and unregisters', async () => {
    const { h, lines } = await watchSpinner({ count: 5 });
    expect(lines[0]).toMatch(/registered as vm \d+ with 1 virtual package/);
    expect(lines[1]).toMatch(/^ +t +vpkg0 W +vpkg0 J$/);
    const rows = lines.slice(2);
    expect(rows).toHaveLength(5);
    for (const r of rows) expect(r).toMatch(/^ +\d+\.\ds +\d+\.\d\d +\d+\.\d{3}$/);
    await untilNoClients(h.socketPath, 'watch cleaned up');
  });

  it('runWatch --json prints the daemon record, a registered record, then update records, every one with a power', async () => {
    const { h, spin, lines } = await watchSpinner({ count: 3, json: true });
    const [daemon, ...recs] = lines.map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(daemon).toMatchObject({ type: 'daemon', socket: h.socketPath });
    expect(recs[0]).toMatchObject({ type: 'registered', pid: spin.pid, nvpkg: 1, name: null });
    expect(recs.slice(1).map((r) => r.type)).toEqual(['update', 'update', 'update']);
    for (const r of recs.slice(1) as { vpkgs: { power_w: unknown; energy_uj: unknown }[] }[]) {
      expect(typeof r.vpkgs[0]!.power_w).toBe('number');
      expect(r.vpkgs[0]!.energy_uj).toMatch(/^\d+$/);
    }
    await untilNoClients(h.socketPath, 'watch cleaned up');
  });

  it('runWatch given an already aborted signal (Ctrl-C during start-up) still returns and unregisters', async () => {
    const h = await startHarness({ intervalMs: 20 });
    cleanups.push(() => h.close());
    const ac = new AbortController();
    ac.abort();
    const lines: string[] = [];
    await runWatch({ socket: h.socketPath, pid: process.pid, vcpus: [{ tid: process.pid, vpkg: 0 }] }, (l) => lines.push(l), ac.signal);
    expect(lines[0]).toMatch(/registered as vm \d+/);
    await untilNoClients(h.socketPath, 'watch cleaned up');
  });

  function watchCli(args: string[]): Promise<{ code: number | null; stderr: string }> {
    ensureBuilt();
    return new Promise((resolve) =>
      execFile(process.execPath, [BIN, 'watch', ...args], (err, _o, stderr) =>
        resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, stderr }),
      ),
    );
  }

  it('the CLI says how to start the helper when nothing listens', async () => {
    const r = await watchCli(['-k', '/tmp/vmsr-no-such.sock', '--pid', String(process.pid), '--vcpus', `${process.pid}:0`]);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/no helper is listening at \/tmp\/vmsr-no-such.sock.*start it with: vmsr-helper -k/);
  });

  it('the CLI refuses --vcpus beside --qmp instead of ignoring it', async () => {
    const r = await watchCli(['-k', '/tmp/vmsr-no-such.sock', '--qmp', '/tmp/vmsr-no-such.qmp', '--vcpus', `${process.pid}:0`]);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/--vcpus goes with --pid, not --qmp/);
  });
});
