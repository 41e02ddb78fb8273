/**
 * The exporter at scale: the helper daemon (built binary, a child) with 100 and 500 registered VMs of
 * 8 vCPUs (python3 processes with 8 sleeping threads stand in for QEMU), and `vmsr-helper exporter`
 * (a child) observing them all. Prints the scrape time (p50/p99 over 30 scrapes of /metrics, as a
 * client sees it), the exposition size, the exporter's RSS and its CPU time per sampling interval.
 * Goal: scrape < 100 ms at 500 VMs.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { V2Client } from '../src/client/v2-client.js';
import { clockTicksPerSecond } from '../src/os/libc.js';
import { FakeHost } from '../test/support/fake-host.js';
import { pollFor } from '../test/support/wait.js';
import { startVms, vcpusOf } from './service.js';

const INTERVAL_S = 1;
const BIN = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../src/bin/vmsr-helper.js');

function child(args: string[]): { proc: ChildProcess; log: () => string } {
  const proc = spawn(process.execPath, [BIN, ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  proc.stderr!.on('data', (d: Buffer) => (log = (log + d.toString()).slice(-20_000)));
  return { proc, log: () => log };
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
  const daemon = child(['-k', sock, '--msr-path', host.msrPathTemplate, '--sys-root', host.sysRoot, '--vendor', 'intel', '--interval', String(INTERVAL_S), '--no-discovery', '--max-vms-per-connection', String(nVms), '--max-vms', String(nVms)]);
  let exporter: ReturnType<typeof child> | null = null;
  let client: V2Client | null = null;
  try {
    await until(() => fs.existsSync(sock), 'the helper socket', daemon.log);
    client = await V2Client.connect(sock);
    for (const k of kids) await client.register({ pid: k.pid!, vcpus: vcpusOf(k.pid!) });
    exporter = child(['exporter', '-k', sock, '--listen', '127.0.0.1:0', '--max-vms', String(nVms)]);
    const ex = exporter;
    await until(() => /"url":"http[^"]+"/.test(ex.log()), 'the exporter to serve', ex.log);
    const url = /"url":"(http[^"]+)"/.exec(ex.log())![1]!;
    const infos = async () => ((await (await fetch(url)).text()).match(/^vmsr_vm_info\{/gm) ?? []).length;
    await until(async () => (await infos()) === nVms, `the exporter to observe ${nVms} VMs`, ex.log);
    // Power needs two samples; then CPU over whole intervals with no scrape.
    await new Promise((r) => setTimeout(r, 2.5 * INTERVAL_S * 1000));
    const pid = ex.proc.pid!;
    const c0 = cpuSeconds(pid);
    await new Promise((r) => setTimeout(r, 5 * INTERVAL_S * 1000));
    const cpuPerInterval = ((cpuSeconds(pid) - c0) / 5) * 1000;
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
        `exporter CPU ${cpuPerInterval.toFixed(1)} ms per ${INTERVAL_S} s interval (${((cpuPerInterval / (INTERVAL_S * 1000)) * 100).toFixed(2)} % of a core)`,
    );
  } finally {
    await client?.close().catch(() => {});
    exporter?.proc.kill('SIGTERM');
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
