/**
 * How long QEMU waits while other local users keep the helper busy: the real daemon (1 s interval)
 * and one QEMU-like legacy connection asking every 10 ms (test/support/legacy-latency.ts), whose
 * round trips are printed as p50, p99 and max, beside QEMU's 0.5 s and the anchor (discovery off):
 *
 * - a discovery storm: uid nobody starts 200 short-lived processes a second that look like QEMU
 *   (test/support/process-storm.ts; each lives 0.5 s with 2 threads named `CPU n/KVM`), with
 *   discovery off (the anchor) and on;
 * - a partial-frame flood: uid nobody holds 3,000 connections each with half a v2 frame (32 KiB of
 *   65,535 announced), reopened as soon as closed (test/support/partial-frame-flood.ts); besides the
 *   probe's round trips, a new connection every 250 ms times connect() to its first reply.
 *
 * Never fails on timing.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { FakeHost } from '../test/support/fake-host.js';
import { LegacyLatencyProbe, newConnectionWaitMs, percentile } from '../test/support/legacy-latency.js';
import { PartialFrameFlood } from '../test/support/partial-frame-flood.js';
import { ProcessStorm } from '../test/support/process-storm.js';
import { HELPER_BIN, waitConnectable } from './tools.js';

const NOBODY = 65534;
const MEASURE_MS = 15_000;
const WARMUP_MS = 3_000;
/** QEMU's vmsr thread waits this long for a reply. */
export const QEMU_REPLY_WAIT_MS = 500;
const STORM = { perSecond: 200, lifeMs: 500, vcpus: 2 };
const FLOOD = { connections: 3000, bodyBytes: 32 * 1024 };
const NEW_CONNECTION_EVERY_MS = 250;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface Daemon {
  proc: ChildProcess;
  sock: string;
  stop(): Promise<void>;
}

async function startDaemon(extra: string[]): Promise<Daemon> {
  const fake = new FakeHost({ packages: [0, 0] });
  const stopPump = fake.pumpEnergy({ units: 5000, everyMs: 100 });
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-bench-latency-'));
  fs.chmodSync(dir, 0o755); // the attacker (uid nobody) reaches the socket
  const sock = path.join(dir, 'helper.sock');
  const args = [HELPER_BIN, '-k', sock, '--socket-mode', '0666', ...fake.cliArgs('intel'), '--interval', '1', ...extra];
  const proc = spawn(process.execPath, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let tail = '';
  proc.stderr!.on('data', (d: Buffer) => (tail = (tail + d.toString()).slice(-4000)));
  await waitConnectable(sock, Date.now() + 20_000);
  return {
    proc,
    sock,
    async stop() {
      proc.kill('SIGTERM');
      await new Promise((r) => (proc.exitCode !== null ? r(null) : proc.once('exit', r)));
      if (proc.exitCode !== 0 && proc.exitCode !== null) console.log(`  daemon exited ${proc.exitCode}: ${tail}`);
      stopPump();
      fake.cleanup();
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

function row(label: string, waits: readonly number[], extra = ''): void {
  const f = (ms: number) => (ms >= 100 ? ms.toFixed(0) : ms.toFixed(2)).padStart(7);
  console.log(
    `  ${label.padEnd(44)} p50 ${f(percentile(waits, 50))} ms  p99 ${f(percentile(waits, 99))} ms  max ${f(Math.max(...waits))} ms` +
      `  (${waits.length} requests${extra})`,
  );
}

/** The probe's round trips over MEASURE_MS while `attack` runs (started before, stopped after). */
async function measure(d: Daemon): Promise<number[]> {
  const probe = await LegacyLatencyProbe.start(d.sock, 10);
  await sleep(WARMUP_MS);
  probe.reset();
  await sleep(MEASURE_MS);
  const late = probe.pendingMs();
  const waits = [...probe.stop()];
  if (late > 0) waits.push(late);
  if (probe.error) console.log(`  probe: ${probe.error}`);
  return waits;
}

export async function storm(discovery: boolean): Promise<void> {
  const d = await startDaemon(discovery ? [] : ['--no-discovery']);
  const s = new ProcessStorm({ ...STORM, uid: NOBODY });
  try {
    await s.ready();
    const before = s.started;
    const waits = await measure(d);
    const rate = (s.started - before) / ((MEASURE_MS + WARMUP_MS) / 1000);
    row(`storm, discovery ${discovery ? 'on' : 'off (anchor)'}`, waits, `, ${rate.toFixed(0)} processes/s started`);
  } finally {
    await s.stop();
    await d.stop();
  }
}

export async function flood(): Promise<void> {
  const d = await startDaemon(['--no-discovery', '--max-connections', '4096']);
  const f = new PartialFrameFlood({ socketPath: d.sock, ...FLOOD, uid: NOBODY });
  try {
    const fresh: number[] = [];
    let running = true;
    const probeFresh = (async () => {
      while (running) {
        fresh.push(await newConnectionWaitMs(d.sock, 30_000));
        await sleep(NEW_CONNECTION_EVERY_MS);
      }
    })();
    const readyAt = performance.now();
    await f.ready(60_000).catch((e: Error) => console.log(`  flood: ${e.message}`));
    const openMs = performance.now() - readyAt;
    fresh.length = 0;
    const waits = await measure(d);
    running = false;
    await probeFresh;
    row(
      'partial-frame flood, connected probe',
      waits,
      `; flood open ${f.open}, reopened ${f.reopened}, ${(openMs / 1000).toFixed(1)} s to open`,
    );
    const answered = fresh.filter(Number.isFinite);
    row('partial-frame flood, new connection to reply', fresh, `, ${fresh.length - answered.length} not answered in 30 s`);
  } finally {
    await f.stop();
    await d.stop();
  }
}

export async function run(): Promise<void> {
  console.log(`\n== latency (QEMU's round trip while other users keep the helper busy; QEMU waits ${QEMU_REPLY_WAIT_MS} ms)`);
  if (process.getuid?.() !== 0) {
    console.log('  skipped: needs root (the attacks run as uid nobody)');
    return;
  }
  if (!fs.existsSync(HELPER_BIN)) {
    console.log(`  skipped: ${HELPER_BIN} missing (npm run build)`);
    return;
  }
  await storm(false);
  await storm(true);
  await flood();
}
