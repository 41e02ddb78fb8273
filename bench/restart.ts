/**
 * A restart in place under load (docs/daemon.md "Restarts"): the real daemon, as root, discovering 500
 * fake VMs of 8 vCPU threads (test/support/fake-qemu.ts), with 64 QEMU-like legacy connections each
 * sending a request, waiting for its reply, then 2 ms, without end. Restarted 3 times by SIGHUP; for
 * each: the time from stopping reading to serving QEMU again and the longest wait of any request
 * across the restart (both beside QEMU's 0.5 s), the time from the signal to serving QEMU (the check
 * of the installed binary runs first, while serving) and to the v2 service set up (the new image's
 * `Listening on` line), and the phases from the daemon's own `restart phases` line. Never fails on timing.
 */
import { QEMU_REPLY_WAIT_MS } from './latency.js';
import { MSR_PKG_ENERGY_STATUS } from '../src/msr/registers.js';
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { V2Client } from '../src/client/v2-client.js';
import { encodeLegacyRequest, LEGACY_REPLY_SIZE } from '../src/protocol/legacy.js';
import { FakeHost } from '../test/support/fake-host.js';
import { FakeQemuFarm } from '../test/support/fake-qemu.js';
import { HELPER_BIN } from './tools.js';

const LEGACY_CLIENTS = 64;
const VMS = 500;
const VCPUS = 8;
const RESTARTS = 3;

const goal = (ms: number) => `goal under ${QEMU_REPLY_WAIT_MS} ms: ${ms < QEMU_REPLY_WAIT_MS ? 'met' : 'NOT met'}`;

/** One QEMU-like connection: a request (one write), its reply, `pauseMs`, again; the longest wait since `reset()`. */
export class LegacyLoop {
  private readonly s: net.Socket;
  private sentAt = 0;
  private buf = Buffer.alloc(0);
  maxWaitMs = 0;
  /** When the longest wait began (performance.now()). */
  maxWaitFrom = 0;
  answered = 0;
  /** performance.now() of the last reply. */
  lastReply = 0;
  error: string | null = null;
  private stopped = false;

  constructor(
    sock: string,
    private readonly pauseMs = 2,
  ) {
    this.s = net.connect(sock, () => this.send());
    this.s.on('data', (d: Buffer) => {
      this.buf = Buffer.concat([this.buf, d]);
      while (this.buf.length >= LEGACY_REPLY_SIZE) {
        this.buf = this.buf.subarray(LEGACY_REPLY_SIZE);
        this.answered++;
        this.lastReply = performance.now();
        const waited = this.lastReply - this.sentAt;
        if (waited > this.maxWaitMs) [this.maxWaitMs, this.maxWaitFrom] = [waited, this.sentAt];
        if (!this.stopped) setTimeout(() => this.send(), this.pauseMs);
      }
    });
    this.s.on('error', (e) => (this.error ??= e.message));
    this.s.on('close', () => (this.error ??= 'closed by the helper'));
  }

  private send(): void {
    if (this.stopped) return;
    this.sentAt = performance.now();
    this.s.write(encodeLegacyRequest({ msr: MSR_PKG_ENERGY_STATUS, cpu: 0, tid: process.pid }));
  }

  reset(): void {
    this.maxWaitMs = 0;
  }

  /** How long the request in flight has waited (ms), or 0 when it was answered. */
  waiting(now: number): number {
    return this.lastReply >= this.sentAt ? 0 : now - this.sentAt;
  }

  stop(): void {
    this.stopped = true;
    this.s.destroy();
  }
}

/** Wall-clock ms of the first log line with `msg` at or after `since` (pino's ISO time), or NaN. */
export function logTime(stderr: string, msg: string, since: number): number {
  for (const line of stderr.split('\n')) {
    if (!line.includes(`"msg":"${msg}`)) continue;
    const t = Date.parse((/"time":"([^"]+)"/.exec(line) ?? [])[1] ?? '');
    if (t >= since) return t;
  }
  return NaN;
}

/** The daemon under test and its log. */
interface Daemon {
  proc: ChildProcess;
  sock: string;
  /** Its stderr (pino's JSON lines) so far. */
  stderr(): string;
}

/** Waits until the daemon listens and its v2 list holds every one of `pids` as a VM of its own (60 s at most). */
async function untilDiscovered(d: Daemon, pids: Set<number>): Promise<void> {
  const end = Date.now() + 60_000;
  while (!d.stderr().includes('"msg":"Listening on')) {
    if (Date.now() > end || d.proc.exitCode !== null) throw new Error(`the daemon did not listen: ${d.stderr().slice(-2000)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  const c = await V2Client.connect(d.sock);
  for (;;) {
    const found = (await c.list()).filter((v) => pids.has(v.pid) && !v.wholeVmOnly).length;
    if (found === VMS) break;
    if (Date.now() > end) throw new Error(`only ${found} of ${VMS} fake VMs discovered in 60 s`);
    await new Promise((r) => setTimeout(r, 200));
  }
  await c.close();
}

/**
 * Restart number `n` (from 1) under the loops' load: SIGHUP, wait until the new image serves and 2 s
 * more, then print its figures and phases. Returns its stopped-to-serving time and longest wait (ms).
 */
async function restartOnce(d: Daemon, loops: LegacyLoop[], n: number): Promise<{ stoppedMs: number; longest: number }> {
  for (const l of loops) l.reset();
  const t0 = Date.now();
  const signalled = performance.now();
  d.proc.kill('SIGHUP');
  while (Number.isNaN(logTime(d.stderr(), 'Listening on', t0))) {
    if (Date.now() - t0 > 30_000 || d.proc.exitCode !== null)
      throw new Error(`restart ${n} did not serve again: ${d.stderr().slice(-2000)}`);
    await new Promise((r) => setTimeout(r, 10));
  }
  await new Promise((r) => setTimeout(r, 2000));
  const stderr = d.stderr();
  const ready = logTime(stderr, 'Listening on', t0) - t0;
  const worst = loops.reduce((a, b) => (b.maxWaitMs > a.maxWaitMs ? b : a));
  const longest = worst.maxWaitMs;
  const worstFrom = worst.maxWaitFrom - signalled;
  const line = stderr.split('\n').findLast((l) => l.includes('"msg":"restart phases"'));
  const rec = line ? (JSON.parse(line) as Record<string, unknown>) : {};
  const checkMs = Number(rec.checkMs);
  const stoppedMs = Number(rec.stoppedToServingMs);
  const phases = Object.entries(rec)
    .filter(([k]) => k.endsWith('Ms'))
    .map(([k, v]) => `${k.slice(0, -2)} ${String(v)}`)
    .join(', ');
  console.log(
    `  restart ${n}: stopped to serving QEMU ${stoppedMs.toFixed(0)} ms (${goal(stoppedMs)}); ` +
      `longest request wait ${longest.toFixed(0)} ms, sent ${worstFrom.toFixed(0)} ms after the signal (${goal(longest)}); ` +
      `signal to serving QEMU ${(checkMs + stoppedMs).toFixed(0)} ms (check ${checkMs.toFixed(0)} ms, while serving), to the v2 service set up ${ready} ms` +
      (phases ? `\n    phases (ms): ${phases}` : ''),
  );
  return { stoppedMs, longest };
}

/** The range over the restarts of both times, and the replies and lost connections of the whole run. */
function printSummary(stopped: number[], waits: number[], loops: LegacyLoop[]): void {
  const range = (xs: number[]) => `${Math.min(...xs).toFixed(0)}-${Math.max(...xs).toFixed(0)} ms`;
  console.log(`  over ${RESTARTS} restarts: stopped to serving QEMU ${range(stopped)}, longest request wait ${range(waits)}`);
  const errors = loops.filter((l) => l.error !== null);
  console.log(
    `  ${loops.reduce((n, l) => n + l.answered, 0)} replies; ${errors.length} of ${LEGACY_CLIENTS} connections lost${errors[0] ? ` (${errors[0].error})` : ''}`,
  );
}

export async function run(): Promise<void> {
  console.log(`\n== restart (SIGHUP under load: ${LEGACY_CLIENTS} legacy clients, ${VMS} discovered VMs of ${VCPUS} vCPUs)`);
  if (process.getuid?.() !== 0) return console.log('  skipped: needs root (the daemon is started as it is in production)');
  if (!fs.existsSync(HELPER_BIN)) return console.log(`  skipped: ${HELPER_BIN} missing (npm run build)`);
  const farm = new FakeQemuFarm(VMS, VCPUS);
  const fake = new FakeHost({ packages: [0, 0] });
  const stopPump = fake.pumpEnergy({ units: 5000, everyMs: 100 });
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-bench-restart-'));
  const sock = path.join(dir, 'helper.sock');
  const daemon = spawn(process.execPath, [HELPER_BIN, '-k', sock, ...fake.cliArgs('intel'), '--interval', '1'], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  daemon.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  const d: Daemon = { proc: daemon, sock, stderr: () => stderr };
  const loops: LegacyLoop[] = [];
  try {
    await untilDiscovered(d, new Set(await farm.ready()));
    for (let i = 0; i < LEGACY_CLIENTS; i++) loops.push(new LegacyLoop(sock));
    await new Promise((r) => setTimeout(r, 2000));
    const stopped: number[] = [];
    const waits: number[] = [];
    for (let i = 0; i < RESTARTS; i++) {
      const { stoppedMs, longest } = await restartOnce(d, loops, i + 1);
      stopped.push(stoppedMs);
      waits.push(longest);
    }
    printSummary(stopped, waits, loops);
  } finally {
    for (const l of loops) l.stop();
    daemon.kill('SIGTERM');
    await new Promise((r) => (daemon.exitCode !== null ? r(null) : daemon.once('exit', r)));
    stopPump();
    await farm.kill();
    fake.cleanup();
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
