/**
 * Traces recorded live with every RAPL domain, on a fake host of two packages whose core, DRAM and
 * PSYS registers count (MSR files read through the real device and MSR source, the real /proc):
 * the sampling loop the daemon's --record runs replays to its live engine's totals exactly, one
 * domain unreadable for a while included; the daemon's chain writes the domains into its trace;
 * and the real `record` command writes them and `replay` prints them.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { pino } from 'pino';
import { afterEach, describe, expect, test } from 'vitest';
import { V2Client } from '../../src/client/v2-client.js';
import { createEnergySource, readHostInfoFor, withDomainCounters } from '../../src/energy/create.js';
import { DEFAULT_V2_LIMITS } from '../../src/helper/v2/v2-limits.js';
import { MsrDevice } from '../../src/msr/device.js';
import { MSR_DRAM_ENERGY_STATUS, MSR_PLATFORM_ENERGY_STATUS, MSR_PP0_ENERGY_STATUS } from '../../src/msr/registers.js';
import { readStarttime } from '../../src/os/proc-starttime.js';
import { ProcTaskReader } from '../../src/os/proc-tasks.js';
import { RatioEngine } from '../../src/ratio/attribution.js';
import type { HostInfo } from '../../src/model/host.js';
import type { VmSpec } from '../../src/model/vm.js';
import { Sampler } from '../../src/sampling/sampler.js';
import { SamplingService } from '../../src/sampling/sampling-service.js';
import { replayFile } from '../../src/trace/reader.js';
import { TraceWriter } from '../../src/trace/writer.js';
import { BIN } from '../daemon/support/daemon-process.js';
import { assembleOnFakeHost, FakeHost } from '../support/fake-host.js';
import { startChild, threadsOf, until } from '../v2/harness.js';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function tmpDir(): string {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-trace-domains-'));
  cleanups.push(() => fs.rmSync(d, { recursive: true, force: true }));
  return d;
}

/** Why this machine cannot run these tests: two packages need two CPUs (the stat lines' CPU numbers are real). */
function tooFewCpus(): string | null {
  return os.cpus().length < 2 ? `needs 2 CPUs for a fake host of 2 packages, this machine has ${os.cpus().length}` : null;
}

/**
 * A fake Intel host of two packages (CPUs alternate between them), ESU 14, whose package, core and
 * DRAM counters count on both and PSYS on package 0, every 5 ms until the test ends. `cut()` makes
 * package 1's DRAM and core unreadable (its MSR file ends below them) while they go on counting;
 * `mend()` makes them readable again, with what they counted meanwhile.
 */
function domainHost() {
  const h = new FakeHost({ packages: os.cpus().map((_, cpu) => cpu % 2) });
  cleanups.push(() => h.cleanup());
  h.writeRapl({ powerUnit: 0xa0e03n, energy: { 0: 0xffff_0000, 1: 1000 } });
  for (const pkg of [0, 1]) {
    h.setCounter(h.cpusOf(pkg), MSR_PP0_ENERGY_STATUS, 1000);
    h.setCounter(h.cpusOf(pkg), MSR_DRAM_ENERGY_STATUS, 0xffff_f000); // wraps early
    h.setCounter(h.cpusOf(pkg), MSR_PLATFORM_ENERGY_STATUS, 1000);
  }
  const pkg1 = h.cpusOf(1);
  let cutAt: number | null = null;
  let owed = 0;
  const pump = setInterval(() => {
    for (const pkg of [0, 1]) {
      h.addEnergy(pkg, 3000 + 1000 * pkg);
      if (pkg === 1 && cutAt !== null) owed++;
      else {
        h.addCounter(h.cpusOf(pkg), MSR_PP0_ENERGY_STATUS, 2000);
        h.addCounter(h.cpusOf(pkg), MSR_DRAM_ENERGY_STATUS, 700 + 300 * pkg);
      }
    }
    h.addCounter(h.cpusOf(0), MSR_PLATFORM_ENERGY_STATUS, 9000);
  }, 5);
  cleanups.push(() => clearInterval(pump));
  return {
    h,
    cut(): void {
      cutAt = MSR_DRAM_ENERGY_STATUS + 1;
      fs.truncateSync(h.msrPath(pkg1[0]!), cutAt); // the package counter (0x611, 8 bytes) stays readable
    },
    mend(): void {
      cutAt = null;
      h.addCounter(pkg1, MSR_DRAM_ENERGY_STATUS, 1000 * owed);
      h.addCounter(pkg1, MSR_PP0_ENERGY_STATUS, 2000 * owed);
      owed = 0;
    },
  };
}

/** A VM of every thread of a spinning process (node: its main thread and helpers), alternately on virtual packages 0 and 1. */
async function spinningVm(): Promise<VmSpec> {
  const spin = startChild('spin');
  cleanups.push(() => spin.kill());
  await until(() => threadsOf(spin.pid).length >= 2, 30_000, 'the spinning process to start its threads');
  return {
    pid: spin.pid,
    starttime: readStarttime('/proc', spin.pid)!,
    vcpus: threadsOf(spin.pid).map((tid, i) => ({ tid, vpkg: i % 2 })),
  };
}

/** Runs the built CLI without blocking this process (the fake host's counters go on meanwhile). */
function cli(args: string[]): Promise<{ status: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const c = spawn(process.execPath, [BIN, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    c.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    c.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    c.on('close', (status) => resolve({ status, stdout, stderr }));
  });
}

function sleepingVm(): VmSpec {
  const sleep = startChild('sleep');
  cleanups.push(() => sleep.kill());
  return { pid: sleep.pid, starttime: readStarttime('/proc', sleep.pid)!, vcpus: [{ tid: sleep.pid, vpkg: 0 }] };
}

describe('live traces with every RAPL domain', () => {
  test('the sampling loop of the daemon records a trace that replays to its live engine totals per domain, a domain unreadable for a while included', async (ctx) => {
    const why = tooFewCpus();
    if (why) return ctx.skip(why);
    const { h, cut, mend } = domainHost();
    const dir = tmpDir();
    const device = new MsrDevice(h.msrPathTemplate);
    cleanups.push(() => device.close());
    const paths = h.hostPaths();
    let host: HostInfo = readHostInfoFor('msr', { paths, device, vendor: 'intel' });
    // Skylake-X: DRAM counts in 15.3 µJ, not in the ESU: a unit of its own in the trace.
    const energy = createEnergySource('msr', { host, paths, device, model: { family: 6, model: 0x55 } });
    host = withDomainCounters(host, energy);
    const tasks = new ProcTaskReader(paths.procRoot);
    cleanups.push(() => tasks.close());
    const tracePath = path.join(dir, 'live.jsonl.gz');
    const trace = TraceWriter.open(tracePath, { host, note: 'domains live test' });
    const engine = new RatioEngine(host);
    const svc = new SamplingService({
      engine,
      sampler: new Sampler(energy, tasks),
      intervalMs: 25,
      trace,
      forgetPid: (pid) => tasks.forget(pid),
      log: pino({ level: 'silent' }),
    });
    cleanups.push(() => svc.close());
    const samples = () => svc.stats.samples;
    const ids = [await spinningVm(), sleepingVm()].map((vm) => svc.register(vm));
    await until(() => samples() >= 12, 20_000, 'samples before the cut');
    cut();
    const cutFrom = samples();
    await until(() => samples() >= cutFrom + 5, 20_000, 'samples while package 1 DRAM and core are unreadable');
    mend();
    const mendAt = samples();
    await until(() => samples() >= mendAt + 12, 20_000, 'samples after');
    svc.close();
    await trace.close();
    const live = ids.map((id) => engine.output(id)!);

    const summary = await replayFile(tracePath);
    expect(summary.header.host.domains).toEqual(host.domains);
    expect(host.domains!.map((d) => `${d.domain} ${d.pkg} ${d.unitJ}`)).toEqual([
      `core 0 ${2 ** -14}`,
      `core 1 ${2 ** -14}`,
      'dram 0 0.0000153',
      'dram 1 0.0000153',
      `psys 0 ${2 ** -14}`,
    ]);
    expect(summary.vms.map((v) => v.output)).toEqual(live);
    for (const domain of ['core', 'dram', 'psys'])
      expect(live[0]!.domains!.find((d) => d.domain === domain)!.vpkgEnergyJ.reduce((a, b) => a + b, 0)).toBeGreaterThan(0);
    // Package 1's DRAM and core were missing from the samples taken while cut, and only from those.
    const missing = summary.problems.first.filter((p) => /no (dram|core) energy value for package 1/.test(p));
    expect(missing.length).toBeGreaterThanOrEqual(2);
    expect(summary.problems.first.every((p) => /no (dram|core) energy value for package 1 in this sample$/.test(p))).toBe(true);
  });

  test("the daemon's chain gives its trace the host's domain counters and every sample's domain readings", async (ctx) => {
    const why = tooFewCpus();
    if (why) return ctx.skip(why);
    const { h } = domainHost();
    const dir = tmpDir();
    const device = new MsrDevice(h.msrPathTemplate);
    cleanups.push(() => device.close());
    const tracePath = path.join(dir, 'daemon.jsonl');
    let trace: TraceWriter | undefined = undefined;
    // The daemon opens its trace with the host its chain read (helper/assemble.ts, assembleDaemonV2).
    const sink = {
      register: (t: bigint, vm: VmSpec) => trace!.register(t, vm),
      sample: (s: Parameters<TraceWriter['sample']>[0]) => trace!.sample(s),
      unregister: (t: bigint, pid: number) => trace!.unregister(t, pid),
    };
    const socketPath = path.join(dir, 'helper.sock');
    const chain = await assembleOnFakeHost(h, device, {
      socketPath,
      intervalMs: 25,
      limits: DEFAULT_V2_LIMITS,
      trace: sink,
      log: pino({ level: 'silent' }),
    });
    cleanups.push(() => chain.close());
    trace = TraceWriter.open(tracePath, { host: chain.host });
    const vm = await spinningVm();
    const c = await V2Client.connect(socketPath);
    cleanups.push(() => c.close());
    const reg = await c.register({ pid: vm.pid, vcpus: vm.vcpus });
    const got: unknown[] = [];
    await c.subscribe(reg.vmId, (u) => got.push(u));
    // The first update is SUBSCRIBE's own (the values then), each later one a sample's: 8 samples with the VM.
    await until(() => got.length >= 9, 30_000, 'updates');
    // READs and UNREGISTER written together: handled in one go, no sample between.
    const [read0, read1] = await Promise.all([c.read(reg.vmId, 0), c.read(reg.vmId, 1), c.unregister(reg.vmId)]);
    await trace.close();

    const lines = fs.readFileSync(tracePath, 'utf8').trimEnd().split('\n');
    expect((JSON.parse(lines[0]!) as { host: { domains: { domain: string }[] } }).host.domains.map((d) => d.domain)).toEqual([
      'core',
      'core',
      'dram',
      'dram',
      'psys',
    ]);
    const samples = lines.filter((l) => l.startsWith('{"type":"sample"')).map((l) => JSON.parse(l) as { domains: unknown });
    expect(samples.length).toBeGreaterThanOrEqual(8);
    for (const s of samples) expect(Object.keys(s.domains as object)).toEqual(['core', 'dram', 'psys']);
    const summary = await replayFile(tracePath);
    const out = summary.vms[0]!.output;
    // The package's numbers are the ones published live.
    expect(out.vpkgs.map((v) => v.energyUj)).toEqual([read0!.energyUj, read1!.energyUj]);
    expect(read0!.energyUj).toBeGreaterThan(0n);
    expect(out.domains!.map((d) => d.domain)).toEqual(['core', 'dram', 'psys']);
    expect(out.domains!.every((d) => d.vpkgEnergyJ.reduce((a, b) => a + b, 0) > 0)).toBe(true);
  });

  test('vmsr-helper record writes every domain into its trace, and vmsr-helper replay prints their energy per VM and per package', async (ctx) => {
    const why = tooFewCpus() ?? (fs.existsSync(BIN) ? null : `${BIN} missing: run npm run build (npm test does)`);
    if (why) return ctx.skip(why);
    const { h } = domainHost();
    const dir = tmpDir();
    const vm = await spinningVm();
    const tracePath = path.join(dir, 'record.jsonl');
    const vcpus = vm.vcpus.map((v) => `${v.tid}:${v.vpkg}`).join(',');
    const rec = await cli([
      'record',
      '--pid',
      String(vm.pid),
      '--vcpus',
      vcpus,
      '-o',
      tracePath,
      '--interval',
      '0.05',
      '--duration',
      '1',
      ...h.cliArgs(),
    ]);
    expect(rec.stderr).toMatch(/; done/);
    expect(rec.status).toBe(0);
    const lines = fs.readFileSync(tracePath, 'utf8').trimEnd().split('\n');
    const header = JSON.parse(lines[0]!) as { host: { domains: { package: number; domain: string; range: string; unit_j: number }[] } };
    expect(header.host.domains.map((d) => `${d.domain} ${d.package} ${d.range}`)).toEqual([
      'core 0 0x100000000',
      'core 1 0x100000000',
      'dram 0 0x100000000',
      'dram 1 0x100000000',
      'psys 0 0x100000000',
    ]);
    type SampleRec = { domains: Record<string, Record<string, string>> };
    const samples = lines.filter((l) => l.startsWith('{"type":"sample"')).map((l) => JSON.parse(l) as SampleRec);
    expect(samples.length).toBeGreaterThanOrEqual(10);

    const replay = await cli(['replay', tracePath, '--json']);
    expect(replay.stderr).toBe('');
    expect(replay.status).toBe(0);
    type Interval = {
      packages: { package: number; domains: Record<string, { energy_j: number; attributed_j: number }> }[];
      vms: { vpkgs: { domains: Record<string, { energy_j: number }> }[] }[];
    };
    const out = replay.stdout.trimEnd().split('\n');
    const intervals = out.slice(0, -1).map((l) => JSON.parse(l) as Interval);
    expect(intervals).toHaveLength(samples.length - 1);
    // Each package's DRAM over the replay is what its counter moved (wrapping at 2^32), in its unit.
    for (const pkg of [0, 1]) {
      const unit = header.host.domains.find((d) => d.domain === 'dram' && d.package === pkg)!.unit_j;
      const first = BigInt(samples[0]!.domains.dram![pkg]!);
      const last = BigInt(samples.at(-1)!.domains.dram![pkg]!);
      const moved = Number((last - first + (1n << 32n)) % (1n << 32n)) * unit;
      const replayed = intervals.reduce((a, r) => a + r.packages.find((p) => p.package === pkg)!.domains.dram!.energy_j, 0);
      expect(moved).toBeGreaterThan(0);
      expect(replayed).toBeCloseTo(moved, 6);
    }
    // The VM's DRAM total is the sum of its interval energies, as an exact microjoule string.
    const total = JSON.parse(out.at(-1)!) as { vms: { vpkgs: { domains: Record<string, { energy_uj: string }> }[] }[] };
    for (const g of [0, 1]) {
      const summed = intervals.reduce((a, r) => a + (r.vms[0]?.vpkgs[g]!.domains.dram!.energy_j ?? 0), 0);
      expect(Number(total.vms[0]!.vpkgs[g]!.domains.dram!.energy_uj) / 1e6).toBeCloseTo(summed, 5);
    }
    const table = await cli(['replay', tracePath]);
    expect(table.status).toBe(0);
    expect(table.stdout).toMatch(/VPKG\s+JOULES\s+AVG W\s+OVER S\s+CORE J\s+DRAM J\s+PSYS J\n/);
  });
});
