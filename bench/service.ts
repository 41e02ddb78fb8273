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
import { DEFAULT_V2_LIMITS } from '../src/helper/v2/v2-limits.js';
import { assembleOnFakeHost, FakeHost } from '../test/support/fake-host.js';
import { MsrDevice } from '../src/msr/device.js';
import type { VcpuSpec } from '../src/model/vcpus.js';

const INTERVAL_MS = 1000;

export const PY =
  'import threading,time\nfor _ in range(8): threading.Thread(target=time.sleep,args=(3600,),daemon=True).start()\nprint("ok",flush=True)\ntime.sleep(3600)';

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

export function vcpusOf(pid: number): VcpuSpec[] {
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
  const fake = new FakeHost({ packages: [0] });
  fake.writeRapl({ powerUnit: 0xa0e03n, energy: { 0: 0x1000 } });
  const device = new MsrDevice(fake.msrPathTemplate);
  const log = pino({ level: 'silent' });
  // The daemon's own assembly and accept path, so READ latency includes what a real client goes through.
  const sock = path.join(dir, 's');
  const chain = await assembleOnFakeHost(fake, device, {
    socketPath: sock,
    intervalMs: INTERVAL_MS,
    limits: { ...DEFAULT_V2_LIMITS, maxVmsPerConnection: 1024 },
    log,
  });
  const { service, tasks } = chain;
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
    await chain.close();
    device.close();
    fake.cleanup();
    for (const k of kids) k.kill('SIGKILL');
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

export async function run(): Promise<void> {
  console.log('\n== v2 service (sampling loop + READ over a real socket)');
  for (const n of [100, 500]) await scenario(n);
}
