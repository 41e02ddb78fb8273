/**
 * Statistics fds at scale (docs/stats-fd.md): 500 VMs of 8 vCPUs (python3 processes with 8 sleeping
 * threads stand in for QEMU).
 *  1. The daemon's CPU per interval (the v2 service in this process, the daemon's own assembly over
 *     fake MSR files) with 0, 1 and "1000" readers polling every VM 10 times a second. The readers run
 *     in READER_PROCS child processes; each holds one fd per VM plus duplicates (up to the fd limit).
 *     Goal: the same figure within noise (readers cost the daemon nothing). What the readers reached
 *     is printed beside the target: two shared cores cannot do 5 million reads/s.
 *  2. One read of a VM's values (StatsReader.read: three preads). Goal: under 5 us.
 *  3. The exporter (in this process) against the daemon (a child): its CPU per interval without
 *     scrapes and per scrape, reading the fds at scrape time.
 */
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { pino } from 'pino';
import { V2Client } from '../src/client/v2-client.js';
import { StatsReader } from '../src/client/stats-reader.js';
import { DEFAULT_V2_LIMITS } from '../src/helper/v2/v2-limits.js';
import { startExporter } from '../src/exporter/exporter-process.js';
import { assembleOnFakeHost, FakeHost } from '../test/support/fake-host.js';
import { MsrDevice } from '../src/msr/device.js';
import { startVms, vcpusOf } from './service.js';
import { HELPER_BIN as BIN } from './tools.js';

const N_VMS = 500;
const INTERVAL_MS = 1000;
const MEASURE_INTERVALS = 5;
const READER_PROCS = 2;
const POLL_HZ = 10;
const HERE = path.dirname(fileURLToPath(import.meta.url));
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const cpuMs = (c: NodeJS.CpuUsage) => (c.user + c.system) / 1e3;

/** A reader process: `readers` readers' worth of polling of every VM, on fds it asked for itself. */
function readerProc(sock: string, ids: number[], readers: number): { proc: ChildProcess; result: Promise<string> } {
  const url = (f: string) => JSON.stringify(pathToFileURL(path.resolve(HERE, f)).href);
  const body = `
    const { V2Client } = await import(${url('../src/client/v2-client.js')});
    const { StatsReader } = await import(${url('../src/client/stats-reader.js')});
    const { dupCloexec } = await import(${url('../src/os/libc/fds.js')});
    const ids = ${JSON.stringify(ids)};
    const c = await V2Client.connect(${JSON.stringify(sock)});
    const rs = []; for (const id of ids) rs.push(StatsReader.open((await c.statsFd(id)).fd));
    await c.close();
    // Hold more fds, as readers of their own would (up to a share of the fd limit).
    let held = rs.length; for (let k = 1; k < ${readers} && held < 8000; k++) for (const r of rs) { if (dupCloexec(r.fd) >= 0) held++; }
    const target = ${readers} * ids.length * ${POLL_HZ};
    let reads = 0; const t0 = Date.now();
    process.stdout.write('ready\\n');
    while (Date.now() - t0 < ${(MEASURE_INTERVALS + 1) * INTERVAL_MS}) {
      const slot = Date.now();
      let budget = Math.ceil(target / 100);
      while (budget-- > 0 && Date.now() - slot < 10) { rs[reads % rs.length].read(); reads++; }
      const left = 10 - (Date.now() - slot); if (left > 0) await new Promise((r) => setTimeout(r, left));
    }
    process.stdout.write(JSON.stringify({ reads, s: (Date.now() - t0) / 1000, held, target }));`;
  const proc = spawn(process.execPath, ['--input-type=module', '-e', body], { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  const result = new Promise<string>((resolve) => {
    proc.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    proc.once('exit', () => resolve(out));
  });
  return { proc, result };
}

async function daemonSide(kids: ChildProcess[]): Promise<void> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-bench-statsfd-'));
  const fake = new FakeHost({ packages: [0] });
  fake.writeRapl({ powerUnit: 0xa0e03n, energy: { 0: 0x1000 } });
  const stopPump = fake.pumpEnergy({ pkg: 0, units: 20_000, everyMs: 100 });
  const device = new MsrDevice(fake.msrPathTemplate);
  const sock = path.join(dir, 's');
  const chain = await assembleOnFakeHost(fake, device, {
    socketPath: sock,
    intervalMs: INTERVAL_MS,
    limits: { ...DEFAULT_V2_LIMITS, maxVmsPerConnection: 1024 },
    log: pino({ level: 'silent' }),
  });
  const client = await V2Client.connect(sock);
  try {
    const ids: number[] = [];
    for (const k of kids) ids.push((await client.register({ pid: k.pid!, vcpus: vcpusOf(k.pid!) })).vmId);
    // Every VM's file exists in every scenario (made at the first STATS_FD): the daemon's work is the same, readers or not.
    const own: StatsReader[] = [];
    for (const id of ids) own.push(StatsReader.open((await client.statsFd(id)).fd));
    await sleep(2 * INTERVAL_MS + 100);
    // A first window unmeasured: the JIT and the heap settle (the first figure was otherwise the highest).
    await sleep(MEASURE_INTERVALS * INTERVAL_MS);
    for (const readers of [0, 1, 1000, 0]) {
      const procs =
        readers === 0
          ? []
          : Array.from({ length: Math.min(READER_PROCS, readers) }, () => readerProc(sock, ids, Math.ceil(readers / READER_PROCS)));
      await Promise.all(procs.map((p) => new Promise<void>((r) => p.proc.stdout!.once('data', () => r()))));
      const s0 = chain.service.stats.samples;
      const c0 = process.cpuUsage();
      await sleep(MEASURE_INTERVALS * INTERVAL_MS);
      const cpu = cpuMs(process.cpuUsage(c0));
      const samples = chain.service.stats.samples - s0;
      const results = (await Promise.all(procs.map((p) => p.result))).map(
        (t) => JSON.parse(t.slice(t.indexOf('{'))) as { reads: number; s: number; held: number; target: number },
      );
      const rate = results.reduce((a, r) => a + r.reads / r.s, 0);
      const target = readers * N_VMS * POLL_HZ;
      const held = results.reduce((a, r) => a + r.held, 0);
      console.log(
        `  ${String(readers).padStart(4)} readers: daemon CPU ${(cpu / Math.max(1, samples)).toFixed(1)} ms per ${INTERVAL_MS} ms interval (${samples} samples)` +
          (readers
            ? `; readers did ${(rate / 1e3).toFixed(0)}k reads/s (target ${(target / 1e3).toFixed(0)}k/s), holding ${held} fds`
            : '') +
          '   [goal: the same figure for 0, 1 and 1000 readers, within noise]',
      );
    }
    // One read, in this process (the file of a VM of 8 vCPUs).
    const r = own[0]!;
    for (let i = 0; i < 10_000; i++) r.read();
    const n = 200_000;
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < n; i++) r.read();
    const us = Number(process.hrtime.bigint() - t0) / 1e3 / n;
    console.log(
      `  one read of a VM's values (StatsReader.read, ${r.layout.dataSize} bytes, from its read-only mapping): ${us.toFixed(2)} us   [goal: under 5 us]`,
    );
    const t1 = process.hrtime.bigint();
    for (let i = 0; i < n; i++) r.readByPread();
    const usP = Number(process.hrtime.bigint() - t1) / 1e3 / n;
    console.log(
      `  one read with pread only (StatsReader.readByPread, 2 preads while unchanged): ${usP.toFixed(2)} us   [goal: under 5 us]`,
    );
    for (const o of own) o.close();
  } finally {
    await client.close();
    await chain.close();
    device.close();
    stopPump();
    fake.cleanup();
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

/**
 * One scrape on a connection of its own, closed after it: fetch's pooled keep-alive connections
 * would leave timers running in this process between scrapes, counted as the exporter's idle CPU.
 */
function scrape(url: string): Promise<string> {
  return new Promise((resolve, reject) => {
    http
      .get(url, { agent: false, headers: { connection: 'close' } }, (res) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (d: string) => (body += d));
        res.on('end', () => resolve(body));
      })
      .on('error', reject);
  });
}

async function exporterSide(kids: ChildProcess[]): Promise<void> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-bench-statsfd-exp-'));
  const fake = new FakeHost({ packages: [0] });
  fake.writeRapl({ powerUnit: 0xa0e03n, energy: { 0: 0x1000 } });
  const stopPump = fake.pumpEnergy({ pkg: 0, units: 20_000, everyMs: 100 });
  const sock = path.join(dir, 's');
  const host = ['--msr-path', fake.msrPathTemplate, '--sys-root', fake.sysRoot, '--vendor', 'intel'];
  const daemon = spawn(
    process.execPath,
    [BIN, '-k', sock, ...host, '--interval', String(INTERVAL_MS / 1000), '--no-discovery', '--max-vms-per-connection', '1024'],
    { stdio: 'ignore' },
  );
  try {
    while (!fs.existsSync(sock)) await sleep(50);
    await sleep(300);
    const reg = await V2Client.connect(sock);
    for (const k of kids) await reg.register({ pid: k.pid!, vcpus: vcpusOf(k.pid!) });
    // This process's own CPU with no exporter (the energy pump's timer, the registering connection): subtracted below.
    const b0 = process.cpuUsage();
    await sleep(MEASURE_INTERVALS * INTERVAL_MS);
    const base = cpuMs(process.cpuUsage(b0)) / MEASURE_INTERVALS;
    console.log(`  (this process without an exporter: ${base.toFixed(1)} ms per interval, subtracted below)`);
    {
      const exporter = await startExporter(
        { socketPath: sock, listen: { host: '127.0.0.1', port: 0 }, maxExportedVms: 1000 },
        () => V2Client.connect(sock),
        pino({ level: 'silent' }),
      );
      try {
        await scrape(exporter.url);
        await sleep(3 * INTERVAL_MS);
        await scrape(exporter.url);
        const c0 = process.cpuUsage();
        await sleep(MEASURE_INTERVALS * INTERVAL_MS);
        const idle = Math.max(0, cpuMs(process.cpuUsage(c0)) / MEASURE_INTERVALS - base);
        const scrapes = 10;
        const c1 = process.cpuUsage();
        let bytes = 0;
        for (let i = 0; i < scrapes; i++) {
          bytes = (await scrape(exporter.url)).length;
          await sleep(INTERVAL_MS / 5);
        }
        const perScrape = (cpuMs(process.cpuUsage(c1)) - ((idle + base) * scrapes) / 5) / scrapes;
        console.log(
          `  exporter reading the fds at scrape: CPU ${idle.toFixed(1)} ms per interval without scrapes, ${perScrape.toFixed(1)} ms per scrape ` +
            `(${(bytes / 1024).toFixed(0)} KiB, ${N_VMS} VMs)   [goal: ~0 ms per interval]`,
        );
      } finally {
        await exporter.stop();
      }
    }
    await reg.close();
  } finally {
    daemon.kill('SIGKILL');
    stopPump();
    fake.cleanup();
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

export async function run(): Promise<void> {
  console.log(`\n== statistics fds (${N_VMS} VMs x 8 vCPUs)`);
  const kids = await startVms(N_VMS);
  try {
    await daemonSide(kids);
    await exporterSide(kids);
  } finally {
    for (const k of kids) k.kill('SIGKILL');
  }
}
