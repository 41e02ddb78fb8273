/**
 * The real daemon with discovery on, at 0, 100 and 500 fake VMs of 8 vCPU threads (python3 children
 * forked from one parent, named qemu-system-x86 with threads named `CPU n/KVM`: what /proc shows of
 * QEMU with debug-threads), sleeping; and 500 whose vCPU threads wake 4 times a second. Prints the daemon's CPU per 1 s interval and RSS, measured from
 * /proc/<daemon>/stat and status, idle and with one client observing every VM plus the host (what
 * the exporter does), and how long the first scan took to find every VM.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { V2Client } from '../src/client/v2-client.js';
import { type HostUpdate } from '../src/client/v2-replies.js';
import { FakeHost } from '../test/support/fake-host.js';
import { FakeQemuFarm } from '../test/support/fake-qemu.js';
import { HELPER_BIN as BIN, rssMiB, waitConnectable } from './tools.js';

const MEASURE_INTERVALS = 10;
const CLK_TCK = 100;

function cpuTicks(pid: number): number {
  const l = fs.readFileSync(`/proc/${pid}/stat`, 'latin1');
  const f = l.slice(l.lastIndexOf(')') + 2).split(' ');
  return Number(f[11]) + Number(f[12]);
}

/** Daemon CPU (ms per interval) over MEASURE_INTERVALS seconds. */
async function measure(pid: number): Promise<number> {
  const t0 = cpuTicks(pid);
  const w0 = Date.now();
  await new Promise((r) => setTimeout(r, MEASURE_INTERVALS * 1000));
  const ms = ((cpuTicks(pid) - t0) * 1000) / CLK_TCK;
  return ms / ((Date.now() - w0) / 1000);
}

async function scenario(n: number, wakeEveryMs?: number): Promise<void> {
  const farm = new FakeQemuFarm(n, 8, { wakeEveryMs });
  const fake = new FakeHost({ packages: [0, 0] });
  const stopPump = fake.pumpEnergy({ units: 5000, everyMs: 100 });
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-bench-disc-'));
  const sock = path.join(dir, 'helper.sock');
  const daemon = spawn(
    process.execPath,
    [BIN, '-k', sock, '--msr-path', fake.msrPathTemplate, '--sys-root', fake.sysRoot, '--vendor', 'intel', '-q', '--interval', '1'],
    {
      stdio: ['ignore', 'ignore', 'pipe'],
    },
  );
  let stderr = '';
  daemon.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  const clients: V2Client[] = [];
  try {
    const pids = await farm.ready();
    await waitConnectable(sock, Date.now() + 20_000);
    const c = await V2Client.connect(sock);
    clients.push(c);
    // Until every fake VM is listed with its vCPU threads (other QEMUs on the machine may be listed too).
    const t0 = Date.now();
    const want = new Set(pids);
    let hostIds: number[] = [];
    for (;;) {
      const vms = await c.list();
      const mine = vms.filter((v) => want.has(v.pid) && !v.wholeVmOnly);
      if (mine.length === n) {
        hostIds = vms.filter((v) => !v.ended).map((v) => v.hostVmId);
        break;
      }
      if (Date.now() - t0 > 60_000) throw new Error(`only ${mine.length} of ${n} fake VMs discovered in 60 s`);
      await new Promise((r) => setTimeout(r, 200));
    }
    const found = (Date.now() - t0) / 1000;
    await new Promise((r) => setTimeout(r, 2000));
    const daemonPid = daemon.pid!;
    const idle = await measure(daemonPid);
    const rssIdle = rssMiB(daemonPid);
    // Exporter-like load: one connection observing every VM and the host.
    const o = await V2Client.connect(sock);
    clients.push(o);
    let last: HostUpdate | undefined;
    await o.subscribeHost((u) => (last = u));
    for (const id of hostIds) await o.observe(id, () => {}).catch(() => {});
    await new Promise((r) => setTimeout(r, 2000));
    const observed = await measure(daemonPid);
    const rssObserved = rssMiB(daemonPid);
    console.log(
      `  ${String(n).padStart(3)} VMs x 8 vCPUs${wakeEveryMs ? `, vCPUs waking every ${wakeEveryMs} ms` : ''}: CPU ${idle.toFixed(1)} ms/s idle (${(idle / 10).toFixed(2)} % of a core), ` +
        `${observed.toFixed(1)} ms/s observed (${(observed / 10).toFixed(2)} %), RSS ${rssIdle.toFixed(0)} / ${rssObserved.toFixed(0)} MiB, ` +
        `last sample ${(Number(last?.stats.lastSampleDurationNs ?? 0n) / 1e6).toFixed(1)} ms, all found ${found.toFixed(1)} s after listening` +
        (hostIds.length > n ? ` (${hostIds.length - n} other VMs on this machine)` : ''),
    );
  } finally {
    for (const c of clients) await c.close().catch(() => {});
    daemon.kill('SIGTERM');
    await new Promise((r) => (daemon.exitCode !== null ? r(null) : daemon.once('exit', r)));
    if (daemon.exitCode !== 0 && daemon.exitCode !== null) console.log(`  daemon exited ${daemon.exitCode}: ${stderr.slice(-2000)}`);
    stopPump();
    await farm.kill();
    fake.cleanup();
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

export async function run(): Promise<void> {
  console.log('\n== discovery (the daemon finding VMs in /proc by itself; 1 s interval)');
  if (process.getuid?.() !== 0) {
    console.log('  skipped: needs root (the daemon is started as it is in production)');
    return;
  }
  if (!fs.existsSync(BIN)) {
    console.log(`  skipped: ${BIN} missing (npm run build)`);
    return;
  }
  for (const n of [0, 100, 500]) await scenario(n);
  // The sampler's gates answer for threads that did not run since the last sample; here every vCPU
  // thread runs in every interval, as an idle guest's do (its timer ticks): the cost without them.
  await scenario(500, 250);
}
