/**
 * The exporter at scale: the helper daemon (built binary, a child) with 100 and 500 registered VMs of
 * 8 vCPUs (python3 processes with 8 sleeping threads stand in for QEMU), and `vmsr-helper exporter`
 * (a child) observing them all. Prints the scrape time (p50/p99 over 30 scrapes of /metrics, as a
 * client sees it), the exporter's CPU per scrape, the exposition size, the exporter's RSS, and its
 * CPU per sampling interval without scrapes and with one every 15 s. Goal: scrape < 100 ms at 500
 * VMs, exporter well under 1 % of a core.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { V2Client } from '../src/client/v2-client.js';
import { clockTicksPerSecond } from '../src/os/libc/processes.js';
import { FakeHost } from '../test/support/fake-host.js';
import { pollFor } from '../test/support/wait.js';
import { startVms, vcpusOf } from './service.js';
import { HELPER_BIN as BIN } from './tools.js';

const INTERVAL_S = 1;
const SETTLE_S = 20;
const IDLE_INTERVALS = 10;
/** The README's scrape_interval: the exporter's CPU share is its per-interval CPU plus a scrape every this many seconds. */
const SCRAPE_EVERY_S = 15;

/**
 * VMSR_BENCH_CPU_PROF=DIR: the exporter runs under `node --cpu-prof` and leaves its profile in DIR
 * (open it in Chrome DevTools or speedscope) to see where scrape and update time go.
 */
const PROFILE_DIR = process.env.VMSR_BENCH_CPU_PROF;

function child(args: string[], nodeFlags: string[] = []): { proc: ChildProcess; log: () => string; exited: Promise<void> } {
  const proc = spawn(process.execPath, [...nodeFlags, BIN, ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
  const exited = new Promise<void>((r) => proc.once('exit', () => r()));
  let log = '';
  proc.stderr!.on('data', (d: Buffer) => (log = (log + d.toString()).slice(-20_000)));
  return { proc, log: () => log, exited };
}

/** Waits until `cond` holds (sync or async), or throws naming `what` with the log. */
function until(cond: () => boolean | Promise<boolean>, what: string, log: () => string, ms = 60_000): Promise<true> {
  return pollFor(async () => ((await cond()) ? true : undefined), what, log, ms);
}

/** utime + stime of a process, in seconds. */
function cpuSeconds(pid: number): number {
  const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(f[11]) + Number(f[12])) / clockTicksPerSecond();
}

function rssMiB(pid: number): number {
  const m = /^VmRSS:\s+(\d+) kB/m.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) / 1024 : NaN;
}

function pct(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor((sorted.length * p) / 100))] ?? NaN;
}

async function scenario(nVms: number): Promise<void> {
  const kids = await startVms(nVms);
  const host = new FakeHost({ packages: [0] });
  const stopPump = host.pumpEnergy({ units: 1600, everyMs: 20 }); // ~5 W at ESU 14
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-bench-exporter-'));
  const sock = path.join(dir, 'helper.sock');
  const daemon = child([
    '-k',
    sock,
    '--msr-path',
    host.msrPathTemplate,
    '--sys-root',
    host.sysRoot,
    '--vendor',
    'intel',
    '--interval',
    String(INTERVAL_S),
    '--no-discovery',
    '--max-vms-per-connection',
    String(nVms),
    '--max-vms',
    String(nVms),
  ]);
  let exporter: ReturnType<typeof child> | null = null;
  let client: V2Client | null = null;
  try {
    await until(() => fs.existsSync(sock), 'the helper socket', daemon.log);
    client = await V2Client.connect(sock);
    for (const k of kids) await client.register({ pid: k.pid!, vcpus: vcpusOf(k.pid!) });
    const prof = PROFILE_DIR ? ['--cpu-prof', '--cpu-prof-dir', PROFILE_DIR, '--cpu-prof-name', `exporter-${nVms}.cpuprofile`] : [];
    exporter = child(['exporter', '-k', sock, '--listen', '127.0.0.1:0', '--max-vms', String(nVms)], prof);
    const ex = exporter;
    await until(() => /"url":"http[^"]+"/.test(ex.log()), 'the exporter to serve', ex.log);
    const url = /"url":"(http[^"]+)"/.exec(ex.log())![1]!;
    const infos = async () => ((await (await fetch(url)).text()).match(/^vmsr_vm_info\{/gm) ?? []).length;
    await until(async () => (await infos()) === nVms, `the exporter to observe ${nVms} VMs`, ex.log);
    // Power needs two samples, and the start (LIST, OBSERVE of every VM, the first scrapes) leaves
    // garbage and code to compile: CPU per interval is measured once that has settled, over whole
    // intervals with no scrape (clock ticks are 10 ms: a long window keeps the rounding small).
    await new Promise((r) => setTimeout(r, SETTLE_S * 1000));
    const pid = ex.proc.pid!;
    const c0 = cpuSeconds(pid);
    const d0 = cpuSeconds(daemon.proc.pid!);
    await new Promise((r) => setTimeout(r, IDLE_INTERVALS * INTERVAL_S * 1000));
    const cpuPerInterval = ((cpuSeconds(pid) - c0) / IDLE_INTERVALS) * 1000;
    // The daemon over the same window: sampling 500 x 9 threads, and its UPDATEs to the exporter.
    const daemonPerInterval = ((cpuSeconds(daemon.proc.pid!) - d0) / IDLE_INTERVALS) * 1000;
    const times: number[] = [];
    let bytes = 0;
    let series = 0;
    const s0 = cpuSeconds(pid);
    for (let i = 0; i < 30; i++) {
      const t = process.hrtime.bigint();
      const body = await (await fetch(url)).text();
      times.push(Number(process.hrtime.bigint() - t) / 1e6);
      bytes = body.length;
      series = body.split('\n').filter((l) => l !== '' && !l.startsWith('#')).length;
    }
    // CPU per scrape (the exporter's own time) next to the wall time a client waits: on a shared
    // machine the second also counts other processes' turns.
    const cpuPerScrape = ((cpuSeconds(pid) - s0) / 30) * 1000;
    times.sort((a, b) => a - b);
    console.log(
      `  ${String(nVms).padStart(3)} VMs x 8 vCPUs (2 vpkgs): scrape p50 ${pct(times, 50).toFixed(1)} ms p99 ${pct(times, 99).toFixed(1)} ms wall, ` +
        `${cpuPerScrape.toFixed(1)} ms exporter CPU per scrape (load average ${os.loadavg()[0]!.toFixed(1)} on ${os.cpus().length} CPUs) ` +
        `(${series} series, ${(bytes / 1024).toFixed(0)} KiB), exporter RSS ${rssMiB(pid).toFixed(0)} MiB, ` +
        `exporter CPU ${cpuPerInterval.toFixed(1)} ms per ${INTERVAL_S} s interval (${((cpuPerInterval / (INTERVAL_S * 1000)) * 100).toFixed(2)} % of a core; ` +
        `${(((cpuPerInterval / INTERVAL_S + cpuPerScrape / SCRAPE_EVERY_S) / 1000) * 100).toFixed(2)} % with a scrape every ${SCRAPE_EVERY_S} s); ` +
        `daemon CPU ${daemonPerInterval.toFixed(1)} ms per interval meanwhile`,
    );
  } finally {
    await client?.close().catch(() => {});
    exporter?.proc.kill('SIGTERM');
    // The profile is written as the exporter exits.
    if (exporter && PROFILE_DIR) await exporter.exited;
    daemon.proc.kill('SIGTERM');
    stopPump();
    for (const k of kids) k.kill('SIGKILL');
    await new Promise((r) => setTimeout(r, 300));
    host.cleanup();
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

export async function run(): Promise<void> {
  console.log('\n== exporter (daemon child + exporter child, scrapes over HTTP)');
  for (const n of [100, 500]) await scenario(n);
}
