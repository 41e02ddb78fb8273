/**
 * v2 service at scale: 100 and 500 registered VMs of 8 vCPUs (python3 processes with 8 sleeping
 * threads each stand in for QEMU), over a real Unix socket. Prints CPU time per sampling interval,
 * resident memory and READ latency p50/p99. Fake MSR files (sparse, pread at offset = MSR).
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawn, type ChildProcess } from 'node:child_process';
import { pino } from 'pino';
import { V2Client } from '../src/client/v2-client.js';
import { LegacyService, OnlineCpus } from '../src/helper/legacy-service.js';
import { HelperServer } from '../src/helper/server.js';
import { createV2Service, DEFAULT_V2_LIMITS } from '../src/helper/v2/service.js';
import { MsrDevice } from '../src/msr/device.js';
import { MsrEnergySource } from '../src/msr/energy-source.js';
import { readHostInfo } from '../src/msr/host-info.js';
import { DEFAULT_AMD_SYNTH } from '../src/msr/legacy-registers.js';
import { MSR_PKG_ENERGY_STATUS, MSR_RAPL_POWER_UNIT } from '../src/msr/registers.js';
import { ProcTaskReader } from '../src/os/proc-tasks.js';
import { Sampler } from '../src/sampling/sampler.js';

const INTERVAL_MS = 1000;

function fakeHost(dir: string): { msrPathTemplate: string; sysRoot: string } {
  const sysRoot = path.join(dir, 'sys');
  const cpuDir = path.join(sysRoot, 'devices/system/cpu');
  fs.mkdirSync(path.join(cpuDir, 'cpu0/topology'), { recursive: true });
  fs.writeFileSync(path.join(cpuDir, 'online'), '0\n');
  fs.writeFileSync(path.join(cpuDir, 'cpu0/topology/physical_package_id'), '0\n');
  const msr = path.join(dir, 'msr0');
  const fd = fs.openSync(msr, 'w');
  const b = Buffer.alloc(8);
  b.writeBigUInt64LE(0xa0e03n);
  fs.writeSync(fd, b, 0, 8, MSR_RAPL_POWER_UNIT);
  b.writeBigUInt64LE(0x1000n);
  fs.writeSync(fd, b, 0, 8, MSR_PKG_ENERGY_STATUS);
  fs.closeSync(fd);
  return { msrPathTemplate: path.join(dir, 'msr%u'), sysRoot };
}

export const PY = 'import threading,time\nfor _ in range(8): threading.Thread(target=time.sleep,args=(3600,),daemon=True).start()\nprint("ok",flush=True)\ntime.sleep(3600)';

export async function startVms(n: number): Promise<ChildProcess[]> {
  const kids: ChildProcess[] = [];
  try {
    for (let i = 0; i < n; i++) {
      const c = spawn('python3', ['-c', PY], { stdio: ['ignore', 'pipe', 'ignore'] });
      kids.push(c);
      await new Promise<void>((resolve, reject) => {
        c.stdout!.once('data', () => resolve());
        c.once('error', reject);
        c.once('exit', () => reject(new Error('python3 exited')));
      });
    }
  } catch (e) {
    // One failed start must not leave the others sleeping for an hour.
    for (const k of kids) k.kill('SIGKILL');
    throw e;
  }
  return kids;
}

export function vcpusOf(pid: number): { tid: number; vpkg: number }[] {
  return fs
    .readdirSync(`/proc/${pid}/task`)
    .map(Number)
    .filter((t) => t !== pid)
    .slice(0, 8)
    .map((tid, i) => ({ tid, vpkg: i % 2 }));
}

function pct(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor((sorted.length * p) / 100))] ?? NaN;
}

async function scenario(nVms: number): Promise<void> {
  const kids = await startVms(nVms);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-bench-v2-'));
  const h = fakeHost(dir);
  const device = new MsrDevice(h.msrPathTemplate);
  const host = readHostInfo({ paths: { ...h, procRoot: '/proc' }, device, vendor: 'intel' });
  const tasks = new ProcTaskReader('/proc');
  const sampler = new Sampler(new MsrEnergySource(device, host.cpus, 'intel'), tasks);
  const log = pino({ level: 'silent' });
  const service = createV2Service({
    host,
    sampler,
    procRoot: '/proc',
    intervalMs: INTERVAL_MS,
    limits: { ...DEFAULT_V2_LIMITS, maxVmsPerConnection: 1024 },
    forgetPid: (p) => tasks.forget(p),
    log,
  });
  // The daemon's own accept path, so READ latency includes what a real client goes through.
  const sock = path.join(dir, 's');
  const legacy = new LegacyService({ device, vendor: 'intel', procRoot: '/proc', cpus: new OnlineCpus(h.sysRoot, host.cpus.map((c) => c.cpu)), amd: DEFAULT_AMD_SYNTH, logger: log });
  const server = new HelperServer({ target: { path: sock }, legacy, v2Handler: service.handler, logger: log });
  await server.listen();
  const client = await V2Client.connect(sock);
  try {
    const rss0 = process.memoryUsage().rss;
    const ids: number[] = [];
    for (const k of kids) ids.push((await client.register({ pid: k.pid!, vcpus: vcpusOf(k.pid!) })).vmId);
    // Let a few samples happen, then measure CPU over whole intervals.
    await new Promise((r) => setTimeout(r, 2 * INTERVAL_MS + 100));
    const s0 = service.stats.samples;
    const cpu0 = process.cpuUsage();
    await new Promise((r) => setTimeout(r, 5 * INTERVAL_MS));
    const cpu = process.cpuUsage(cpu0);
    const samples = service.stats.samples - s0;
    const lat: number[] = [];
    for (let i = 0; i < 2000; i++) {
      const t = process.hrtime.bigint();
      await client.read(ids[i % ids.length]!, 0);
      lat.push(Number(process.hrtime.bigint() - t) / 1e3);
    }
    lat.sort((a, b) => a - b);
    const rss = process.memoryUsage().rss;
    console.log(
      `  ${String(nVms).padStart(3)} VMs x 8 vCPUs: CPU ${((cpu.user + cpu.system) / 1e3 / Math.max(1, samples)).toFixed(1)} ms per ${INTERVAL_MS} ms interval ` +
        `(${samples} samples, lateness ${(Number(service.stats.lastLatenessNs) / 1e6).toFixed(1)} ms), RSS ${(rss / 2 ** 20).toFixed(0)} MiB ` +
        `(+${((rss - rss0) / 2 ** 20).toFixed(1)} MiB), READ p50 ${pct(lat, 50).toFixed(0)} us p99 ${pct(lat, 99).toFixed(0)} us, stat fds ${tasks.openFds}`,
    );
  } finally {
    await client.close();
    await service.close();
    await server.close();
    tasks.close();
    device.close();
    for (const k of kids) k.kill('SIGKILL');
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

export async function run(): Promise<void> {
  console.log('\n== v2 service (sampling loop + READ over a real socket)');
  for (const n of [100, 500]) await scenario(n);
}
