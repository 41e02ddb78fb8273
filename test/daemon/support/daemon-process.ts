/**
 * Runs the real helper binary (dist/, built on demand) as a child process against a FakeHost, and
 * talks QEMU's protocol to it over real Unix sockets.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { encodeLegacyRequest } from '../../../src/protocol/legacy.js';
import { NO_KEEPER_ENV } from '../../../src/keeper/keeper-messages.js';
import { waitFor } from '../../support/wait.js';

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
export const BIN = path.join(ROOT, 'dist/src/bin/vmsr-helper.js');

let built = false;
/** Builds dist/ when any source is newer than the binary (tsc emits even if other files have errors), and the man page and completion. */
export function ensureBuilt(): void {
  if (built) return;
  const newest = (dir: string): number => {
    let t = 0;
    for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
      const p = path.join(dir, e.name);
      t = Math.max(t, e.isDirectory() ? newest(p) : fs.statSync(p).mtimeMs);
    }
    return t;
  };
  const binTime = fs.existsSync(BIN) ? fs.statSync(BIN).mtimeMs : 0;
  if (newest(path.join(ROOT, 'src')) > binTime) {
    try {
      execFileSync(path.join(ROOT, 'node_modules/.bin/tsc'), ['-p', ROOT], { stdio: 'ignore' });
    } catch {
      /* type errors elsewhere still emit JS */
    }
  }
  if (!fs.existsSync(BIN)) throw new Error(`build failed: ${BIN} missing`);
  // The build's last step (npm run build): the man page and the completion, made from the CLI.
  const man = path.join(ROOT, 'dist/share/man/man1/vmsr-helper.1');
  if (!fs.existsSync(man) || fs.statSync(man).mtimeMs < fs.statSync(BIN).mtimeMs)
    execFileSync(process.execPath, [path.join(ROOT, 'dist/src/bin/make-docs.js'), path.join(ROOT, 'dist/share')], { stdio: 'ignore' });
  built = true;
}

/**
 * The environment of a start as users make it: the test suite's config turns the keeper off
 * (vitest.config.ts); this puts the default back, so the helper started alone runs under its keeper.
 */
export function defaultKeeperEnv(env: NodeJS.ProcessEnv = process.env): NodeJS.ProcessEnv {
  const out = { ...env };
  delete out[NO_KEEPER_ENV];
  return out;
}

/** The keeper's one child: the serving process (throws unless there is exactly one). */
export function servingPid(keeper: number): number {
  const kids = fs.readFileSync(`/proc/${keeper}/task/${keeper}/children`, 'utf8').trim().split(/\s+/).filter(Boolean);
  if (kids.length !== 1) throw new Error(`the keeper (pid ${keeper}) has ${kids.length} children, one expected`);
  return Number(kids[0]);
}

export function tempDir(prefix = 'vmsr-daemon-'): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), prefix));
}

export interface DaemonChild {
  proc: ChildProcess;
  stderr(): string;
  /** Resolves with the exit code (or signal name) when the child ends. */
  exited: Promise<number | string>;
  stop(signal?: NodeJS.Signals): Promise<number | string>;
}

/** Processes whose command line ends with `args` (the script and its arguments), from /proc. */
function sameCommandLine(args: readonly string[]): number[] {
  const tail = args.join('\0');
  const out: number[] = [];
  for (const name of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      if (fs.readFileSync(`/proc/${name}/cmdline`, 'utf8').replace(/\0$/, '').endsWith(tail)) out.push(Number(name));
    } catch {
      /* gone */
    }
  }
  return out;
}

function killIfAlive(pid: number): void {
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    /* gone already */
  }
}

export function spawnHelper(
  args: string[],
  opts: { env?: NodeJS.ProcessEnv; command?: string[]; uid?: number; gid?: number } = {},
): DaemonChild {
  ensureBuilt();
  const cmd = opts.command ?? [process.execPath, BIN];
  const proc = spawn(cmd[0]!, [...cmd.slice(1), ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: opts.env ?? process.env,
    uid: opts.uid,
    gid: opts.gid,
  });
  let err = '';
  proc.stderr!.on('data', (d: Buffer) => (err += d.toString()));
  proc.stdout!.on('data', (d: Buffer) => (err += d.toString()));
  const exited = new Promise<number | string>((resolve) => proc.on('exit', (code, sig) => resolve(code ?? sig ?? -1)));
  const child: DaemonChild = {
    proc,
    stderr: () => err,
    exited,
    async stop(signal: NodeJS.Signals = 'SIGTERM') {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill(signal);
      const t = setTimeout(() => proc.kill('SIGKILL'), 5000);
      const r = await exited;
      clearTimeout(t);
      // A keeper killed outright leaves its serving process running (docs/daemon.md "Crashes"): it goes
      // too, found by its command line (the keeper's own), whenever the keeper started it.
      if (r === 'SIGKILL') for (const k of sameCommandLine(proc.spawnargs.slice(1))) killIfAlive(k);
      return r;
    },
  };
  running.add(child);
  void exited.then(() => running.delete(child));
  return child;
}

/** Every helper this test file started that has not ended yet. */
const running = new Set<DaemonChild>();

/**
 * Ends the helpers a test file left running: one whose start outlived its hook's timeout was never
 * handed to the file's afterAll (test/support/leftover-helpers.ts runs this after every file).
 */
export async function stopLeftHelpers(): Promise<void> {
  await Promise.all([...running].map((d) => d.stop('SIGKILL')));
}

export { waitFor };

/**
 * How many times the daemon said "Listening on": its start, and each restart in place once its new
 * image may restart again (a SIGHUP before is ignored by design: docs/security.md, "A second SIGHUP
 * during a restart"). "handed over" comes earlier, when QEMU's connections are served again.
 */
export function listenings(d: Pick<DaemonChild, 'stderr'>): number {
  return d.stderr().split('"msg":"Listening on').length - 1;
}

export async function startHelper(args: string[], opts: { env?: NodeJS.ProcessEnv; command?: string[] } = {}): Promise<DaemonChild> {
  const child = spawnHelper(args, opts);
  await waitFor(() => listenings(child) > 0, 'the helper to listen', child);
  return child;
}

/** A QEMU-like client: one connection, request() sends 12 bytes and resolves with the 8-byte reply. */
export class LegacyClient {
  private buf = Buffer.alloc(0);
  private waiters: { n: number; resolve: (b: Buffer) => void; reject: (e: Error) => void }[] = [];
  closed = false;
  readonly ready: Promise<void>;

  constructor(readonly socket: net.Socket) {
    this.ready = new Promise((resolve, reject) => {
      socket.once('connect', () => resolve());
      socket.once('error', reject);
    });
    socket.on('data', (d: Buffer) => {
      this.buf = Buffer.concat([this.buf, d]);
      this.flush();
    });
    socket.on('error', () => {});
    socket.on('close', () => {
      this.closed = true;
      for (const w of this.waiters.splice(0)) w.reject(new Error('connection closed by the helper'));
    });
  }

  /**
   * QEMU connects with a blocking connect(), which waits while the listen backlog is full; Node's is
   * non-blocking and fails with EAGAIN instead, so that case is retried.
   */
  static async connect(socketPath: string): Promise<LegacyClient> {
    for (let attempt = 0; ; attempt++) {
      const c = new LegacyClient(net.connect({ path: socketPath }));
      try {
        await c.ready;
        return c;
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== 'EAGAIN' || attempt > 50) throw e;
        await new Promise((r) => setTimeout(r, 10));
      }
    }
  }

  private flush(): void {
    while (this.waiters.length && this.buf.length >= this.waiters[0]!.n) {
      const w = this.waiters.shift()!;
      w.resolve(this.buf.subarray(0, w.n));
      this.buf = this.buf.subarray(w.n);
    }
  }

  /** Resolves with the next `n` reply bytes. */
  readBytes(n: number): Promise<Buffer> {
    return new Promise((resolve, reject) => {
      if (this.closed && this.buf.length < n) return reject(new Error('connection closed by the helper'));
      this.waiters.push({ n, resolve, reject });
      this.flush();
    });
  }

  send(bytes: Buffer): void {
    this.socket.write(bytes);
  }

  async request(msr: number, cpu: number, tid: number): Promise<bigint> {
    this.send(req(msr, cpu, tid));
    return (await this.readBytes(8)).readBigUInt64LE(0);
  }

  /** Resolves once the helper has closed the connection (fails after `ms`). */
  whenClosed(ms = 5000): Promise<void> {
    return new Promise((resolve, reject) => {
      if (this.closed) return resolve();
      const t = setTimeout(() => reject(new Error('helper did not close the connection')), ms);
      this.socket.once('close', () => {
        clearTimeout(t);
        resolve();
      });
    });
  }

  close(): void {
    this.socket.destroy();
  }
}

/** One legacy request (its byte layout is pinned in units.test.ts). */
export function req(msr: number, cpu: number, tid: number): Buffer {
  return encodeLegacyRequest({ msr, cpu, tid });
}

/** Common arguments pointing the helper at a FakeHost. */
export function hostArgs(h: { msrPathTemplate: string; sysRoot: string }, vendor: 'intel' | 'amd' = 'intel'): string[] {
  return ['--msr-path', h.msrPathTemplate, '--sys-root', h.sysRoot, '--vendor', vendor];
}
