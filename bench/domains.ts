/**
 * Sampling cost with every RAPL domain against the package alone (goal: under 1.2x).
 *
 * First what the host pays, the goal's figure: real daemons (the built entry, started as in
 * production, discovery off) on the same fake host of two packages of 16 CPUs with all five domains
 * counting, three reading every domain and three started with `--domains package`, each with the same
 * fake VMs registered over v2 (python3 processes named like QEMU whose vCPU threads wake 4 times a
 * second, as an idle guest's timer does). They run side by side and their CPU (every thread:
 * /proc/<pid>/task/N/schedstat) is read over the same windows, so what the machine does meanwhile falls
 * on both. A whole interval: the sample in slices, the engine, the host totals, the statistics files,
 * the event loop, the garbage collector. They sample every 10 ms (the shortest interval) and are
 * measured after 3000 intervals: V8 compiles the functions of an interval with its optimizing compiler
 * only after they ran many times, each compile taking up to 30 ms of its worker thread, and the more
 * code an interval runs the more of them; that one-time cost of a daemon's first thousands of
 * intervals (its first hour at the default 1 s) would otherwise be most of what is measured.
 *
 * Then where the extra goes: CPU time of one interval's sample and its attribution alone
 * (Sampler.sample: energy read, then the VM threads' stat lines from /proc; then
 * RatioEngine.addSample with each process registered as a one-vCPU VM), hot in a loop, for the MSR
 * source (one pread per package and domain) and the powercap source (one pread per zone), with no VM
 * thread but this process's and with 100 and 1000 sleeping VM threads (python3 processes, as
 * bench/sampling.ts). The energy part grows by one pread per domain read (7 more here: 3 per package
 * and PSYS once, about 0.6 us each with the call), which no system call batches (the msr driver reads
 * one register per pread, each powercap zone is its own file): against a sample that reads few threads
 * that is a large part, against the daemon's interval a small one. Repeats give the spread; the ratio
 * is per repeat.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { V2Client } from '../src/client/v2-client.js';
import { readHostInfoFor, withDomainCounters } from '../src/energy/create.js';
import { MsrEnergySource } from '../src/energy/msr-source.js';
import { readStarttime } from '../src/os/proc-starttime.js';
import { RatioEngine } from '../src/ratio/attribution.js';
import { PowercapEnergySource } from '../src/energy/powercap-source.js';
import type { EnergySource } from '../src/energy/energy-source.js';
import { MsrDevice } from '../src/msr/device.js';
import {
  MSR_DRAM_ENERGY_STATUS,
  MSR_PKG_ENERGY_STATUS,
  MSR_PLATFORM_ENERGY_STATUS,
  MSR_PP0_ENERGY_STATUS,
  MSR_PP1_ENERGY_STATUS,
} from '../src/msr/registers.js';
import { readHostCpus } from '../src/msr/topology.js';
import { ProcTaskReader } from '../src/os/proc-tasks.js';
import { Sampler } from '../src/sampling/sampler.js';
import { FakeHost, TWO_PACKAGE_ZONES } from '../test/support/fake-host.js';
import { FakeQemuFarm } from '../test/support/fake-qemu.js';
import { vcpusOf } from './service.js';
import { startProcs } from './sampling.js';
import { printTable, ratioText, spreadText } from './stats.js';
import { cpuSeconds, HELPER_BIN, waitConnectable } from './tools.js';

const REPEATS = 7;

/** µs of CPU per sample read and attributed over `n` samples. */
function perSample(sampler: Sampler, engine: RatioEngine, pids: number[], n: number): number {
  for (let i = 0; i < n / 10; i++) engine.addSample(sampler.sample(pids)); // warm up
  const a = process.cpuUsage();
  for (let i = 0; i < n; i++) engine.addSample(sampler.sample(pids));
  const d = process.cpuUsage(a);
  return (d.user + d.system) / n;
}

/** An engine for `source`'s host with every pid registered as a VM of one vCPU (its main thread). */
function engineFor(kind: 'msr' | 'powercap', source: EnergySource, h: FakeHost, device: MsrDevice, pids: number[]): RatioEngine {
  const host = withDomainCounters(readHostInfoFor(kind, { paths: h.hostPaths(), device, vendor: 'intel' }), source);
  const engine = new RatioEngine(host);
  for (const pid of pids) engine.register({ pid, starttime: readStarttime('/proc', pid) ?? 0, vcpus: [{ tid: pid, vpkg: 0 }] });
  return engine;
}

const DOMAIN_MSRS = [MSR_PP0_ENERGY_STATUS, MSR_PP1_ENERGY_STATUS, MSR_DRAM_ENERGY_STATUS, MSR_PLATFORM_ENERGY_STATUS];

function fakeHost(): FakeHost {
  const h = new FakeHost({ packages: [...Array<number>(16).fill(0), ...Array<number>(16).fill(1)] });
  h.writeRapl({ powerUnit: 0xa0e03n, energy: { 0: 1000, 1: 1000 } });
  for (const pkg of [0, 1]) for (const msr of DOMAIN_MSRS) h.setCounter(h.cpusOf(pkg), msr, 1000);
  h.writePowercap(TWO_PACKAGE_ZONES.map((z) => ({ ...z, max: 262143328850n, uj: 1n })));
  return h;
}

/** Every counter of fakeHost() counting, 3 J per pump (60 W at a pump per 50 ms); returns the stop. */
function pumpAll(h: FakeHost, everyMs: number): () => void {
  const t = setInterval(() => {
    // Only the CPU each package's registers are read through (its first): the pump's own writes stay few.
    for (const pkg of [0, 1])
      for (const msr of [MSR_PKG_ENERGY_STATUS, ...DOMAIN_MSRS]) h.addCounter(h.cpusOf(pkg).slice(0, 1), msr, 50_000);
    for (const z of TWO_PACKAGE_ZONES) h.addZoneEnergy(z.id, 3_000_000n);
  }, everyMs);
  return () => clearInterval(t);
}

/** The daemon's side by side measurement: its interval, the windows, the warm-up before them. */
const DAEMON_INTERVAL_S = 0.01;
const DAEMON_WARMUP_S = 30;
const DAEMON_WINDOW_S = 8;
const DAEMON_WINDOWS = 5;
/**
 * Daemons of each kind run at once, their CPU averaged: what V8 optimizes when differs from one
 * process to the next and moves one daemon's figure by a tenth or more.
 */
const DAEMON_PAIRS = 3;

/** A real daemon on `h`, discovery off, reading every domain or (`all` false) the package alone. */
function startDaemon(h: FakeHost, source: 'msr' | 'powercap', all: boolean, socket: string): ChildProcess {
  const args = [HELPER_BIN, '-k', socket, '--sys-root', h.sysRoot, '--vendor', 'intel', '-q', '--no-discovery'];
  args.push('--interval', String(DAEMON_INTERVAL_S), '--energy-source', source);
  if (source === 'msr') args.push('--msr-path', h.msrPathTemplate);
  if (!all) args.push('--domains', 'package');
  return spawn(process.execPath, args, { stdio: ['ignore', 'ignore', 'inherit'] });
}

/**
 * µs of daemon CPU per interval, package only and every domain, per window: DAEMON_PAIRS daemons of
 * each kind side by side (their mean), `vms` fake VMs of `vcpus` vCPUs registered on each.
 */
async function daemonWindows(
  h: FakeHost,
  source: 'msr' | 'powercap',
  vms: number,
  vcpus: number,
): Promise<{ only: number[]; every: number[] }> {
  const farm = new FakeQemuFarm(vms, vcpus, { wakeEveryMs: 250 });
  const stopPump = pumpAll(h, DAEMON_INTERVAL_S * 1000);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-bench-domains-'));
  // The package-only daemons first, then as many reading every domain.
  const kinds = [...Array<boolean>(DAEMON_PAIRS).fill(false), ...Array<boolean>(DAEMON_PAIRS).fill(true)];
  const daemons: ChildProcess[] = [];
  const clients: V2Client[] = [];
  try {
    const pids = await farm.ready();
    for (const [i, all] of kinds.entries()) {
      const socket = path.join(dir, `${i}.sock`);
      daemons.push(startDaemon(h, source, all, socket));
      await waitConnectable(socket, Date.now() + 20_000);
      const c = await V2Client.connect(socket);
      clients.push(c);
      for (const pid of pids) await c.register({ pid, vcpus: vcpusOf(pid) });
    }
    await sleep(DAEMON_WARMUP_S * 1000);
    const only: number[] = [];
    const every: number[] = [];
    for (let w = 0; w < DAEMON_WINDOWS; w++) {
      const before = daemons.map((d) => cpuSeconds(d.pid!));
      const t0 = performance.now();
      await sleep(DAEMON_WINDOW_S * 1000);
      const intervals = (performance.now() - t0) / 1000 / DAEMON_INTERVAL_S;
      const mean = (all: boolean) =>
        daemons.reduce((sum, d, i) => (kinds[i] === all ? sum + ((cpuSeconds(d.pid!) - before[i]!) * 1e6) / intervals : sum), 0) /
        DAEMON_PAIRS;
      only.push(mean(false));
      every.push(mean(true));
    }
    return { only, every };
  } finally {
    for (const c of clients) await c.close().catch(() => {});
    for (const d of daemons) {
      d.kill('SIGTERM');
      if (d.exitCode === null && d.signalCode === null) await new Promise((r) => d.once('exit', r));
    }
    stopPump();
    await farm.kill();
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

/** "1.07 (1.02 / 0.95–1.31)": the windows' total ratio, then their median ratio and range. */
function totalRatioText(every: readonly number[], only: readonly number[]): string {
  const sum = (xs: readonly number[]) => xs.reduce((s, x) => s + x, 0);
  return `${(sum(every) / sum(only)).toFixed(2)} (${ratioText(every, only).replace(' (', ' / ')}`;
}

async function daemonTable(): Promise<void> {
  const windows = `${DAEMON_PAIRS} daemons of each kind, ${DAEMON_WINDOWS} windows of ${DAEMON_WINDOW_S} s after ${DAEMON_WARMUP_S} s`;
  console.log(
    `\n== domains: the daemon's CPU per ${DAEMON_INTERVAL_S * 1000} ms interval, every RAPL domain vs the package alone (${windows})`,
  );
  const h = fakeHost();
  const rows = [
    ['source', 'VMs', 'package only, us/interval', 'all 5 domains, us/interval', 'ratio all/package: total (median / range) (goal < 1.2)'],
  ];
  try {
    for (const [source, vms, vcpus] of [
      ['msr', 4, 2],
      ['powercap', 4, 2],
      ['msr', 50, 8],
    ] as const) {
      const { only, every } = await daemonWindows(h, source, vms, vcpus);
      rows.push([source, `${vms} x ${vcpus} vCPUs`, spreadText(only, 0), spreadText(every, 0), totalRatioText(every, only)]);
    }
    printTable(rows);
  } finally {
    h.cleanup();
  }
}

export async function run(): Promise<void> {
  await daemonTable();
  await sampleTable();
}

/** The sample and its attribution alone, hot: where the daemon's extra per interval comes from. */
async function sampleTable(): Promise<void> {
  console.log(`\n== domains: where the extra goes, CPU time of one sample and its attribution alone, hot (${REPEATS} repeats)`);
  const h = fakeHost();
  const device = new MsrDevice(h.msrPathTemplate);
  const cpus = readHostCpus(h.sysRoot);
  const make = {
    msr: (all: boolean): EnergySource =>
      new MsrEnergySource({ device, cpus, vendor: 'intel', sysRoot: h.sysRoot, ...(all ? {} : { domains: [] }) }),
    powercap: (all: boolean): EnergySource =>
      new PowercapEnergySource({ sysRoot: h.sysRoot, cpus, vendor: 'intel', ...(all ? {} : { domains: [] }) }),
  };
  const rows = [['source', 'VM threads', 'package only, us/sample', 'all 5 domains, us/sample', 'ratio all/package']];
  let procs: ChildProcess[] = [];
  try {
    for (const threads of [0, 100, 1000]) {
      procs = threads > 0 ? await startProcs(threads) : [];
      const pids = threads > 0 ? procs.map((p) => p.pid!) : [process.pid];
      const n = threads >= 1000 ? 500 : threads > 0 ? 3000 : 20_000;
      for (const kind of ['msr', 'powercap'] as const) {
        const build = make[kind];
        const tasks = new ProcTaskReader('/proc');
        const pkgOnly = build(false);
        const all = build(true);
        const [a, b] = [new Sampler(pkgOnly, tasks), new Sampler(all, tasks)];
        const only: number[] = [];
        const every: number[] = [];
        const [ea, eb] = [engineFor(kind, pkgOnly, h, device, pids), engineFor(kind, all, h, device, pids)];
        for (let r = 0; r < REPEATS; r++) {
          only.push(perSample(a, ea, pids, n));
          every.push(perSample(b, eb, pids, n));
        }
        rows.push([
          kind,
          threads === 0 ? "(the bench's own)" : String(threads),
          spreadText(only, 1),
          spreadText(every, 1),
          ratioText(every, only),
        ]);
        pkgOnly.close();
        all.close();
        tasks.close();
      }
      for (const p of procs) p.kill();
    }
    printTable(rows);
  } finally {
    for (const p of procs) p.kill();
    device.close();
    h.cleanup();
  }
}
