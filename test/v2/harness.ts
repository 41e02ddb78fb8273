/**
 * A v2 service on a real Unix socket, in this process, built by the daemon's own assembly
 * (helper/assemble.ts): FakeHost MSR files read through the real MsrDevice and MSR energy source, the real
 * /proc through ProcTaskReader, and the daemon's real accept path (HelperServer: SO_PEERCRED, the
 * 4-byte preamble, legacy beside v2).
 */
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { spawn, type ChildProcess } from 'node:child_process';
import { pino } from 'pino';
import { MsrDevice } from '../../src/msr/device.js';
import type { HostInfo } from '../../src/model/host.js';
import { V2_MAGIC } from '../../src/protocol/legacy.js';
import type { V2Service } from '../../src/helper/v2/service.js';
import { DEFAULT_V2_LIMITS, type V2Limits } from '../../src/helper/v2/v2-limits.js';
import type { FdAdmitter } from '../../src/helper/v2/vm-registry.js';
import type { TraceSink } from '../../src/sampling/sampling-service.js';
import type { ScannerOptions } from '../../src/discovery/scanner.js';
import { assembleOnFakeHost, FakeHost } from '../support/fake-host.js';
import { pollFor, waitFor } from '../support/wait.js';
import { V2Client } from '../../src/client/v2-client.js';
import { StatsReader } from '../../src/client/stats-reader.js';
import { which } from '../support/env.js';

export const POWER_UNIT = 0xa0e03n; // ESU 14: 61 uJ per unit

export interface Harness {
  socketPath: string;
  dir: string;
  fake: FakeHost;
  host: HostInfo;
  service: V2Service;
  /** Adds `units` to package 0's energy counter (wrapping at 32 bits). */
  addEnergy(units: number): void;
  close(): Promise<void>;
}

export interface HarnessOptions {
  intervalMs?: number;
  limits?: Partial<V2Limits>;
  trace?: TraceSink;
  /** Discovery on (the real /proc), with these scanner options; default off. */
  discovery?: Partial<Omit<ScannerOptions, 'clkTck'>> | boolean;
  observerGid?: number;
  fds?: FdAdmitter;
  /** RAPL domain registers (MSR numbers) that count on package 0 from the start, so the energy source reads those domains too. */
  domainMsrs?: readonly number[];
}

export async function startHarness(o: HarnessOptions = {}): Promise<Harness> {
  const fake = new FakeHost({ packages: [0, 0] });
  fake.writeRapl({ powerUnit: POWER_UNIT, energy: { 0: 0xfff00000 } }); // wraps early in every test
  for (const msr of o.domainMsrs ?? []) fake.setCounter(fake.cpusOf(0), msr, 1000);
  const device = new MsrDevice(fake.msrPathTemplate);
  const log = pino({ level: process.env.V2_TEST_LOG ?? 'silent' });
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-v2-'));
  fs.chmodSync(dir, 0o755); // a non-root child must reach the socket
  const socketPath = path.join(dir, 'helper.sock');
  const chain = await assembleOnFakeHost(fake, device, {
    socketPath,
    intervalMs: o.intervalMs ?? 50,
    limits: { ...DEFAULT_V2_LIMITS, ...o.limits },
    ...(o.trace ? { trace: o.trace } : {}),
    log,
    ...(o.discovery !== undefined ? { discovery: o.discovery } : {}),
    ...(o.observerGid !== undefined ? { observerGid: o.observerGid } : {}),
    ...(o.fds ? { fds: o.fds } : {}),
  });
  fs.chmodSync(socketPath, 0o777);
  return {
    socketPath,
    dir,
    fake,
    host: chain.host,
    service: chain.service,
    addEnergy(units) {
      fake.addEnergy(0, units);
    },
    async close() {
      await chain.close();
      device.close();
      fake.cleanup();
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Threads of a process, from /proc. */
export function threadsOf(pid: number): number[] {
  return fs
    .readdirSync(`/proc/${pid}/task`)
    .map(Number)
    .sort((a, b) => a - b);
}

export interface TestChild {
  child: ChildProcess;
  pid: number;
  kill(): Promise<void>;
}

/** A child that spins (busy) or sleeps; killed by the returned kill(). */
export function startChild(kind: 'spin' | 'sleep'): TestChild {
  return killable(
    kind === 'spin' ? spawn(process.execPath, ['-e', 'for(;;){}'], { stdio: 'ignore' }) : spawn('sleep', ['120'], { stdio: 'ignore' }),
  );
}

function killable(child: ChildProcess): TestChild {
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  return {
    child,
    pid: child.pid!,
    async kill() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await exited;
    },
  };
}

/**
 * A child bound to one CPU (taskset, so every thread it starts is bound too) that is busy
 * `busyMs` of every 100 ms: it draws energy on that CPU's package without taking a whole core
 * from a machine the tests share. Why it cannot run here, or null (needs taskset and that CPU).
 */
export function pinnedChildMissing(cpu: number): string | null {
  if (!which('taskset')) return 'taskset not installed (util-linux)';
  if (os.availableParallelism() <= cpu) return `needs CPU ${cpu} (this machine has ${os.availableParallelism()})`;
  return null;
}

export function startPinnedChild(cpu: number, busyMs: number): TestChild {
  const body = `setInterval(() => { const end = Date.now() + ${busyMs}; while (Date.now() < end); }, 100)`;
  return killable(spawn('taskset', ['-c', String(cpu), process.execPath, '-e', body], { stdio: 'ignore' }));
}

/** Raw bytes client: everything the helper sends is collected; `closed` resolves on close. */
export class RawClient {
  readonly socket: net.Socket;
  received = Buffer.alloc(0);
  readonly closed: Promise<void>;
  private waiters: (() => void)[] = [];

  private constructor(socket: net.Socket) {
    this.socket = socket;
    socket.on('data', (d: Buffer) => {
      this.received = Buffer.concat([this.received, d]);
      for (const w of this.waiters.splice(0)) w();
    });
    socket.on('error', () => {});
    this.closed = new Promise((r) => socket.once('close', () => r()));
  }

  static connect(socketPath: string, magic = true): Promise<RawClient> {
    return new Promise((resolve, reject) => {
      const s = net.createConnection(socketPath, () => {
        if (magic) s.write(V2_MAGIC);
        resolve(new RawClient(s));
      });
      s.once('error', reject);
    });
  }

  write(b: Buffer): void {
    this.socket.write(b);
  }

  /** Waits until at least `n` bytes were received (or the timeout). */
  async waitBytes(n: number, timeoutMs = 3000): Promise<Buffer> {
    const end = Date.now() + timeoutMs;
    while (this.received.length < n) {
      if (Date.now() > end) throw new Error(`timed out waiting for ${n} bytes, have ${this.received.length}`);
      await new Promise<void>((r) => {
        this.waiters.push(r);
        setTimeout(r, 50);
      });
    }
    return this.received;
  }

  destroy(): void {
    this.socket.destroy();
  }
}

/** waitFor with the argument order these tests read best in. */
export function until(cond: () => boolean, timeoutMs = 5000, what = 'condition'): Promise<void> {
  return waitFor(cond, what, undefined, timeoutMs);
}

/** Waits until `cond` resolves true (polled), or throws naming `what`. */
export async function untilAsync(cond: () => Promise<boolean>, timeoutMs = 5000, what = 'condition'): Promise<void> {
  await pollFor(
    async () => ((await cond()) ? true : undefined),
    what,
    () => '',
    timeoutMs,
  );
}

/**
 * What a new client is told by HOST_SUBSCRIBE (root: every VM): the VMs, and the connections besides
 * its own. HOST_SUBSCRIBE runs the loop while it lasts: not for a test that counts samples.
 */
export async function seenByNewClient(socketPath: string): Promise<{ vms: number; connections: number }> {
  const c = await V2Client.connect(socketPath);
  try {
    const { stats } = await c.subscribeHost(() => {});
    return { vms: stats.vms, connections: stats.connections - 1 };
  } finally {
    await c.close();
  }
}

/** Until a new client is told of no VM and no other connection: every client's close was handled. */
export function untilNoClients(socketPath: string, what: string): Promise<void> {
  return untilAsync(async () => JSON.stringify(await seenByNewClient(socketPath)) === '{"vms":0,"connections":0}', 3000, what);
}

/** The loop's samples so far, read at once from the host statistics file (STATS_FD 0 of root client `c`). */
export async function hostSamples(c: Pick<V2Client, 'statsFd'>): Promise<{ now(): number; close(): void }> {
  const r = StatsReader.open((await c.statsFd(0)).fd);
  return { now: () => Number(r.value(r.read(), 'samples')), close: () => r.close() };
}

/** The loop is idle: no sample for 150 ms (an interval in flight had 50 ms to end). */
export async function expectIdle(samples: { now(): number }): Promise<void> {
  await new Promise((r) => setTimeout(r, 50));
  const n = samples.now();
  await new Promise((r) => setTimeout(r, 150));
  if (samples.now() !== n) throw new Error(`the loop sampled while idle: ${n} -> ${samples.now()} samples`);
}
