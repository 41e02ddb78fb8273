/**
 * The cost of one legacy MSR_PKG_ENERGY_STATUS request in `--guest-energy exact` against `raw`
 * (goal, docs/guest-energy.md: exact costs at most 1.2x raw), measured two ways; prints ratios and
 * never fails on timing.
 *
 * 1. The daemon's code path, in this process (LegacyService.answer, the hook, GuestEnergy): requests
 *    as QEMU sends them on a one-package host, a window's start then its end 1 s later (on a clock
 *    the bench advances). The "VM" is this process (about 10 threads; the vCPU a worker thread that
 *    spins), its stat fds held by a ProcTaskReader as the sampler holds them; raw reads the fake
 *    host's MSR file. Two figures: the reply path (answer), and all the work (answer and the work
 *    done right after the reply, afterReplies); CPU time of this thread (CLOCK_THREAD_CPUTIME_ID,
 *    with its own cost of about 1 µs a read in both modes), so that a busy host does not count.
 * 2. The whole request over a real Unix socket to the real daemon (dist/src/bin/vmsr-helper.js on a
 *    fake host): bench/native/vmsr-thread.c, a stand-in QEMU (its version literal in its binary,
 *    a spinning "CPU 0/KVM" thread, IDLE_THREADS sleeping ones) asks as QEMU's vmsr thread asks (1 s
 *    windows) and prints each request's latency (send to reply) and the daemon main thread's run
 *    time over it (from asleep before it to asleep after the reply). Medians over the windows after
 *    the warm-up (the VM becomes exact at a window's start once discovered). And each daemon's whole
 *    CPU a window over the same windows (every thread, from /proc/PID/task/N/schedstat: its
 *    sampling, the same in both modes, is included, and so is work done at other times).
 * 3. The same once more with the daemons pinned to one CPU and the stand-in to another (taskset):
 *    on a host with cores to spare, the work a daemon does right after a reply does not keep the
 *    woken vmsr thread waiting for the CPU, as it can on a 2-core machine.
 */
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Worker } from 'node:worker_threads';
import pino from 'pino';
import { FakeHost, legacyOnFakeHost } from '../test/support/fake-host.js';
import { MsrDevice } from '../src/msr/device.js';
import { GuestEnergy } from '../src/helper/guest/guest-energy.js';
import { ProcTaskReader } from '../src/os/proc-tasks.js';
import { threadCpuTimeNs } from '../src/os/libc/processes.js';
import { MSR_PKG_ENERGY_STATUS, MSR_RAPL_POWER_UNIT } from '../src/msr/registers.js';
import type { LegacyRequest } from '../src/protocol/legacy.js';
import { readStarttime } from '../src/os/proc-starttime.js';
import { buildTools, cpuSeconds, HELPER_BIN, waitConnectable } from './tools.js';

const PAIRS = 3000;
const ROUNDS = 3;
const GOAL = 1.2;
const WINDOWS = 24;
const WARMUP_WINDOWS = 4;
const IDLE_THREADS = 8;

const ratio = (a: number, b: number) => `${(a / b).toFixed(2)}x`;

export async function run(): Promise<void> {
  await codePath();
  await overSocket(null);
  // Once more with the daemons and the stand-in on CPUs of their own: what is left when the work a
  // daemon does right after a reply does not keep the woken vmsr thread off the CPU.
  const pins = pinning();
  if ('why' in pins) console.log(`guest energy, pinned: not measured: ${pins.why}`);
  else await overSocket(pins);
}

/** The CPUs of the pinned pass: the daemons on one, the stand-in QEMU on another. */
interface Pins {
  daemons: number;
  qemu: number;
}

/** The pinned pass's CPUs, or why there is none (fewer than 2 CPUs, no taskset). */
function pinning(): Pins | { why: string } {
  const cpus = os.availableParallelism();
  if (cpus < 2) return { why: `${cpus} CPU available, 2 needed` };
  const r = spawnSync('taskset', ['--version'], { stdio: 'ignore' });
  if (r.status !== 0) return { why: 'taskset (util-linux) is not installed' };
  return { daemons: 1, qemu: 0 };
}

/** `argv` run on `cpu` (taskset executes it: the pid is the command's), or as it is. */
function pinned(cpu: number | undefined, argv: readonly string[]): [string, string[]] {
  return cpu === undefined ? [argv[0]!, argv.slice(1)] : ['taskset', ['-c', String(cpu), ...argv]];
}

/** A worker thread that spins until terminated (the busy vCPU); its tid. */
async function spinner(): Promise<{ tid: number; stop: () => Promise<number> }> {
  const src = `Promise.all([import('node:worker_threads'), import('node:fs')]).then(([w, fs]) => {
    w.parentPort.postMessage(Number(fs.readlinkSync('/proc/thread-self').split('/').pop()));
    for (;;) {}
  });`;
  const w = new Worker(src, { eval: true });
  const tid = await new Promise<number>((r) => w.once('message', r));
  return { tid, stop: () => w.terminate() };
}

async function codePath(): Promise<void> {
  const fake = new FakeHost({ packages: [0, 0] });
  const log = pino({ level: 'silent' });
  const device = new MsrDevice(fake.msrPathTemplate);
  const legacy = legacyOnFakeHost(fake, device, log);
  const verdicts = legacy.verdictsFor(process.pid);
  const req: LegacyRequest = { msr: MSR_PKG_ENERGY_STATUS, cpu: 0, tid: process.pid };
  const starttime = readStarttime('/proc', process.pid)!;
  const me = { pid: process.pid, uid: process.getuid!(), gid: process.getgid!(), starttime };
  const out = Buffer.alloc(8);
  const vcpu = await spinner();
  const tasks = new ProcTaskReader('/proc');
  tasks.read(process.pid); // the sampler keeps this VM's stat fds open
  let now = 1_000_000_000n;
  const guest = new GuestEnergy({
    procRoot: '/proc',
    host: { vendor: 'intel', clkTck: 100, cpus: [0, 1].map((cpu) => ({ cpu, pkg: 0 })), packages: [{ pkg: 0, powerUnit: 0xa0e03n }] },
    unitJ: 2 ** -14,
    find: (pid) =>
      pid === process.pid ? { vmId: 1, pid, starttime, vcpus: new Map([[vcpu.tid, 0]]), nvpkg: 1, exactJ: Number(now) / 1e9 } : undefined,
    log,
    clock: () => now,
    maxThreads: 4608,
    heldFds: (pid, tid) => tasks.heldFds(pid, tid),
    versionOf: () => Promise.resolve('10.0.2'),
  });
  // One window as QEMU's vmsr thread makes it: the start request, then (1 s later) the end request.
  // Per kind (start, end), µs a request: the reply path alone (answer), or with afterReplies.
  const time = (n: number, what: 'reply' | 'all'): [number, number] => {
    const ns = [0n, 0n];
    for (let i = 0; i < n; i++) {
      for (const k of [0, 1]) {
        const t0 = threadCpuTimeNs();
        legacy.answer(me, req, verdicts, out, 0);
        const t1 = threadCpuTimeNs();
        legacy.afterReplies();
        ns[k]! += (what === 'reply' ? t1 : threadCpuTimeNs()) - t0;
        now += k === 0 ? 1_000_000_000n : 2_000_000n;
      }
    }
    return [Number(ns[0]) / 1000 / n, Number(ns[1]) / 1000 / n];
  };
  const avg = (x: [number, number]) => (x[0] + x[1]) / 2;
  const show = (x: [number, number], raw: [number, number]) =>
    `start ${x[0].toFixed(1)} end ${x[1].toFixed(1)}, a request ${avg(x).toFixed(1)} (${ratio(avg(x), avg(raw))})`;
  const threads = fs.readdirSync(`/proc/${process.pid}/task`).length;
  console.log(`guest energy, the daemon's code path: µs a request, ${PAIRS} windows a round, this process (${threads} threads) as the VM`);
  legacy.answer(me, { ...req, msr: MSR_RAPL_POWER_UNIT }, verdicts, out, 0);
  for (let round = 1; round <= ROUNDS; round++) {
    legacy.setEnergyStatus({ answer: () => undefined, afterReplies: () => undefined });
    time(100, 'all');
    const raw = time(PAIRS, 'all');
    legacy.setEnergyStatus(guest);
    time(2, 'all');
    await new Promise((r) => setTimeout(r, 10)); // the version read resolves
    time(100, 'all');
    const reply = time(PAIRS, 'reply');
    const all = time(PAIRS, 'all');
    console.log(
      `  round ${round}: raw ${avg(raw).toFixed(1)}; exact reply path: ${show(reply, raw)}; all work: ${show(all, raw)}; goal ${GOAL}x`,
    );
  }
  await vcpu.stop();
  tasks.close();
  device.close?.();
  fake.cleanup();
}

interface Figures {
  latency: number[];
  cpu: number[];
  /** Per request, µs runnable but waiting for a CPU: the daemon's main thread, and the stand-in woken by the reply. */
  waits: [number, number][];
}

interface Helper {
  pid: number;
  sock: string;
  log(): string;
  stop(): Promise<void>;
}

/** The real daemon in `mode` on a fake host of its own, listening. */
async function startHelper(mode: 'raw' | 'exact', cpu?: number): Promise<Helper> {
  const fake = new FakeHost({ packages: [0, 0] });
  const stopPump = fake.pumpEnergy({ units: 5000, everyMs: 100 });
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), `vmsr-bench-guest-${mode}-`));
  const sock = path.join(dir, 'helper.sock');
  const args = [HELPER_BIN, '-k', sock, ...fake.cliArgs('intel'), '--interval', '1', '--guest-energy', mode];
  const daemon = spawn(...pinned(cpu, [process.execPath, ...args]), { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  daemon.stderr!.on('data', (d: Buffer) => (log = (log + d.toString()).slice(-20_000)));
  const stop = async () => {
    daemon.kill('SIGTERM');
    await new Promise((r) => (daemon.exitCode !== null ? r(null) : daemon.once('exit', r)));
    stopPump();
    fake.cleanup();
    fs.rmSync(dir, { recursive: true, force: true });
  };
  try {
    await waitConnectable(sock, Date.now() + 20_000);
  } catch (e) {
    await stop();
    throw e;
  }
  return { pid: daemon.pid!, sock, log: () => log, stop };
}

/** Per helper (0 raw, 1 exact): per kind, its figures after the warm-up; and its whole CPU a window (µs, every thread). */
interface StandInFigures {
  requests: Record<'start' | 'end', Figures>[];
  wholeCpu: number[];
}

/**
 * The stand-in QEMU asking a raw and an exact daemon in turn, window by window; per helper its
 * figures after the warm-up; null with the reason printed.
 */
async function standIn(tool: string, helpers: readonly Helper[], cpu?: number): Promise<StandInFigures | null> {
  // Named and started as libvirt starts QEMU (an absolute argv[0]): the helper may read the
  // version from argv[0] when /proc/PID/exe is not its to read (it runs as another user).
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-bench-qemu-'));
  const exe = path.join(dir, 'qemu-system-x86_64');
  fs.copyFileSync(tool, exe);
  // As big as an installed program (exe-version.ts reads a root QEMU's argv[0] only then; its /proc/PID/exe is not the daemon's to follow).
  fs.appendFileSync(exe, Buffer.alloc(2 << 20));
  fs.chmodSync(exe, 0o755);
  fs.chmodSync(dir, 0o755);
  const argv = [exe, String(WINDOWS), String(IDLE_THREADS), ...helpers.flatMap((h) => [h.sock, String(h.pid)])];
  const qemu = spawn(...pinned(cpu, argv), {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  let text = '';
  // Each daemon's whole CPU (every thread: sampling, timers, the work after replies) over the windows measured.
  let cpu0: number[] | undefined;
  const warmLines = 2 * helpers.length * WARMUP_WINDOWS;
  qemu.stdout!.on('data', (d: Buffer) => {
    text += d.toString();
    if (cpu0 === undefined && text.split('\n').length > warmLines) cpu0 = helpers.map((h) => cpuSeconds(h.pid));
  });
  const code = await new Promise<number | null>((r) => qemu.once('exit', r));
  const cpu1 = helpers.map((h) => cpuSeconds(h.pid));
  fs.rmSync(dir, { recursive: true, force: true });
  if (code !== 0) {
    console.log(`  cannot measure: the stand-in QEMU exited ${code}`);
    return null;
  }
  const out = helpers.map(
    () => ({ start: { latency: [], cpu: [], waits: [] }, end: { latency: [], cpu: [], waits: [] } }) as Record<'start' | 'end', Figures>,
  );
  text
    .trim()
    .split('\n')
    .slice(2 * helpers.length * WARMUP_WINDOWS)
    .forEach((line) => {
      const [who, kind, lat, cpu, dwait, swait] = line.split(' ') as [string, 'start' | 'end', string, string, string, string];
      out[Number(who)]![kind].latency.push(Number(lat) / 1000);
      out[Number(who)]![kind].cpu.push(Number(cpu) / 1000);
      out[Number(who)]![kind].waits.push([Number(dwait) / 1000, Number(swait) / 1000]);
    });
  const windows = WINDOWS - WARMUP_WINDOWS;
  return { requests: out, wholeCpu: cpu1.map((c, i) => ((c - (cpu0?.[i] ?? NaN)) * 1e6) / windows) };
}

const median = (xs: readonly number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? NaN;
/** The p-th percentile (nearest rank): of 20 windows, p99 is the slowest. */
const percentile = (xs: readonly number[], p: number) => [...xs].sort((a, b) => a - b)[Math.ceil((p / 100) * xs.length) - 1] ?? NaN;
/** The cost goals (docs/guest-energy.md, "Cost"): the daemon's whole CPU a window, and a window's end answered within 1 ms at p99. */
const END_P99_GOAL_US = 1000;

/** The real daemons asked by the stand-in QEMU; `pins`: each on its own CPU (null: where the scheduler puts them). */
async function overSocket(pins: Pins | null): Promise<void> {
  const windows = WINDOWS - WARMUP_WINDOWS;
  const where = pins === null ? '' : `, pinned: the daemons on CPU ${pins.daemons}, the stand-in on CPU ${pins.qemu}`;
  console.log(
    `guest energy, the whole request to the real daemon over its socket${where}: µs, medians of ${windows} windows, ` +
      `a stand-in QEMU of ${IDLE_THREADS + 2} threads (one spinning vCPU) asking a raw and an exact daemon in turn`,
  );
  const tools = buildTools();
  if ('unavailable' in tools) {
    console.log(`  cannot run: ${tools.unavailable}`);
    return;
  }
  const helpers: Helper[] = [];
  try {
    helpers.push(await startHelper('raw', pins?.daemons), await startHelper('exact', pins?.daemons));
    const figures = await standIn(tools['vmsr-thread'], helpers, pins?.qemu);
    if (figures === null) return;
    if (!helpers[1]!.log().includes('exact for this VM')) {
      console.log(`  cannot measure: the exact daemon never answered this VM exact (its log: ${helpers[1]!.log().slice(-400)})`);
      return;
    }
    const [raw, exact] = figures.requests as [Record<'start' | 'end', Figures>, Record<'start' | 'end', Figures>];
    for (const what of ['latency', 'cpu'] as const) {
      const label = what === 'latency' ? 'latency (send to reply)' : "daemon's CPU (main thread)";
      const r = [median(raw.start[what]), median(raw.end[what])] as const;
      const e = [median(exact.start[what]), median(exact.end[what])] as const;
      console.log(
        `  ${label}: raw start ${r[0].toFixed(1)} end ${r[1].toFixed(1)}; exact start ${e[0].toFixed(1)} (${ratio(e[0], r[0])}) ` +
          `end ${e[1].toFixed(1)} (${ratio(e[1], r[1])}); a request on average ${ratio(e[0] + e[1], r[0] + r[1])} (goal ${GOAL}x)`,
      );
    }
    const [wr, we] = figures.wholeCpu as [number, number];
    console.log(
      `  daemon's whole CPU a window (every thread; its sampling, the same in both, included): raw ${wr.toFixed(0)}, ` +
        `exact ${we.toFixed(0)} (${ratio(we, wr)}, goal ${GOAL}x); exact's extra, a request: ${((we - wr) / 2).toFixed(0)}`,
    );
    const p99 = percentile(exact.end.latency, 99);
    // Where the time of that end went: the daemon's CPU, its wait for a CPU, the woken stand-in's wait.
    const where = (f: Figures) => {
      const i = f.latency.indexOf(percentile(f.latency, 99));
      return `${f.latency[i]!.toFixed(0)} (daemon ran ${f.cpu[i]!.toFixed(0)}, waited for a CPU ${f.waits[i]![0].toFixed(0)}; the woken stand-in waited ${f.waits[i]![1].toFixed(0)})`;
    };
    console.log(
      `  a window's end answered (send to reply), p99 of ${exact.end.latency.length}: raw ${where(raw.end)}, ` +
        `exact ${where(exact.end)} (goal ${END_P99_GOAL_US}: ${p99 <= END_P99_GOAL_US ? 'met' : 'NOT met'}); median exact ${median(exact.end.latency).toFixed(0)}; load average ${os.loadavg()[0]!.toFixed(1)}`,
    );
    // Less those waits (the daemon's counts its wait after the reply too, so this errs low): the time the answer itself took.
    const own = (f: Figures) =>
      percentile(
        f.latency.map((l, i) => Math.max(0, l - f.waits[i]![0] - f.waits[i]![1])),
        99,
      ).toFixed(0);
    console.log(`  the same less the daemon's and the stand-in's waits for a CPU, p99: raw ${own(raw.end)}, exact ${own(exact.end)}`);
  } finally {
    for (const h of helpers) await h.stop();
    fs.rmSync(tools.dir, { recursive: true, force: true });
  }
}
