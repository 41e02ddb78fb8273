/**
 * A v2 service on a real Unix socket, in this process: FakeHost MSR files read through the real
 * MsrDevice/MsrEnergySource, the real /proc through ProcTaskReader, and the daemon's real accept path
 * (HelperServer: SO_PEERCRED, the 4-byte preamble, legacy beside v2).
 */
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { spawn, type ChildProcess } from 'node:child_process';
import { pino } from 'pino';
import { MsrDevice } from '../../src/msr/device.js';
import { MsrEnergySource } from '../../src/msr/energy-source.js';
import { readHostInfo } from '../../src/msr/host-info.js';
import { DEFAULT_AMD_SYNTH } from '../../src/msr/legacy-registers.js';
import { MSR_PKG_ENERGY_STATUS, MSR_RAPL_POWER_UNIT } from '../../src/msr/registers.js';
import { ProcTaskReader } from '../../src/os/proc-tasks.js';
import { Sampler } from '../../src/sampling/sampler.js';
import type { HostInfo } from '../../src/ratio/types.js';
import { LegacyService, OnlineCpus } from '../../src/helper/legacy-service.js';
import { HelperServer } from '../../src/helper/server.js';
import { V2_MAGIC } from '../../src/protocol/v2/codec.js';
import { createV2Service, DEFAULT_V2_LIMITS, type FdAdmitter, type V2Limits, type V2Service } from '../../src/helper/v2/service.js';
import type { TraceSink } from '../../src/helper/sampling-service.js';
import { FakeHost } from '../support/fake-host.js';
import { ProcScanner, type ScannerOptions } from '../../src/discovery/scanner.js';
import { waitFor } from '../support/wait.js';

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
  discovery?: Partial<ScannerOptions> | boolean;
  observerGid?: number;
  fds?: FdAdmitter;
}

export async function startHarness(o: HarnessOptions = {}): Promise<Harness> {
  const fake = new FakeHost({ packages: [0, 0] });
  fake.writePackageMsr(0, MSR_RAPL_POWER_UNIT, POWER_UNIT);
  let energy = 0xfff00000; // wraps early in every test
  fake.writePackageMsr(0, MSR_PKG_ENERGY_STATUS, BigInt(energy));
  const device = new MsrDevice(fake.msrPathTemplate);
  const paths = { msrPathTemplate: fake.msrPathTemplate, procRoot: '/proc', sysRoot: fake.sysRoot };
  const host = readHostInfo({ paths, device, vendor: 'intel' });
  const tasks = new ProcTaskReader('/proc');
  const sampler = new Sampler(new MsrEnergySource(device, host.cpus, 'intel'), tasks);
  const log = pino({ level: process.env.V2_TEST_LOG ?? 'silent' });
  const scanner = o.discovery ? new ProcScanner('/proc', { clkTck: host.clkTck, ...(o.discovery === true ? {} : o.discovery) }) : undefined;
  const service = createV2Service({
    host,
    sampler,
    procRoot: '/proc',
    intervalMs: o.intervalMs ?? 50,
    limits: { ...DEFAULT_V2_LIMITS, ...o.limits },
    trace: o.trace,
    forgetPid: (pid) => tasks.forget(pid),
    log,
    ...(scanner ? { discovery: scanner } : {}),
    ...(o.observerGid !== undefined ? { observerGid: o.observerGid } : {}),
    ...(o.fds ? { fds: o.fds } : {}),
  });
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-v2-'));
  fs.chmodSync(dir, 0o755); // a non-root child must reach the socket
  const socketPath = path.join(dir, 'helper.sock');
  const legacy = new LegacyService({ device, vendor: 'intel', procRoot: '/proc', cpus: new OnlineCpus(fake.sysRoot, host.cpus.map((c) => c.cpu)), amd: DEFAULT_AMD_SYNTH, logger: log });
  const server = new HelperServer({ target: { path: socketPath }, legacy, v2Handler: service.handler, logger: log });
  await server.listen();
  fs.chmodSync(socketPath, 0o777);
  return {
    socketPath,
    dir,
    fake,
    host,
    service,
    addEnergy(units) {
      energy = (energy + units) >>> 0;
      fake.writePackageMsr(0, MSR_PKG_ENERGY_STATUS, BigInt(energy));
    },
    async close() {
      await service.close();
      await server.close();
      tasks.close();
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

/** A child that spins (busy) or sleeps; killed by the returned kill(). */
export function startChild(kind: 'spin' | 'sleep'): { child: ChildProcess; pid: number; kill(): Promise<void> } {
  const child =
    kind === 'spin'
      ? spawn(process.execPath, ['-e', 'for(;;){}'], { stdio: 'ignore' })
      : spawn('sleep', ['120'], { stdio: 'ignore' });
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
