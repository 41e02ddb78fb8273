/** A small QMP client; the socket is hostile input: lines bounded, non-JSON or unexpected replies end it, every wait timed. */
import fs from 'node:fs';
import net from 'node:net';
import { getPeerCredentials, socketFd } from '../os/libc/sockets.js';
import { checkThreadsOf } from '../os/vm-threads.js';
import { readStarttime } from '../os/proc-starttime.js';
import { type VcpuSpec, checkVcpus } from '../model/vcpus.js';
import type { VmSpec } from '../model/vm.js';

/** Longest line accepted from the monitor; query-cpus-fast of 4096 vCPUs stays far below it. */
const QMP_MAX_LINE = 4 * 1024 * 1024;
const DEFAULT_TIMEOUT_MS = 5000;

export class QmpError extends Error {
  constructor(
    message: string,
    /** QMP error class (e.g. "CommandNotFound"), or a local one: "Protocol", "Timeout", "Closed", "Connect". */
    readonly errorClass: string,
  ) {
    super(message);
  }
}

interface QmpConnectOptions {
  /** Timeout for connect + greeting + negotiation, and the default per command; default 5000 ms. */
  timeoutMs?: number;
  maxLine?: number;
}

interface Pending {
  resolve: (v: unknown) => void;
  reject: (e: Error) => void;
  timer: NodeJS.Timeout;
}

/** The key of the greeting's wait among the pending replies (command ids are "vmsr-N"). */
const GREETING = '';

interface QmpCpu {
  threadId: number;
  socketId: number | undefined;
}

export class QmpClient {
  private buf = '';
  private nextId = 1;
  private readonly pending = new Map<string, Pending>();
  private failure: Error | null = null;

  private constructor(
    private readonly sock: net.Socket,
    readonly path: string,
    private readonly timeoutMs: number,
    private readonly maxLine: number,
  ) {
    sock.setEncoding('utf8');
    sock.on('data', (d: string) => this.onData(d));
    sock.on('error', (e) => this.fail(new QmpError(`QMP socket ${path}: ${e.message}`, 'Closed')));
    sock.on('close', () => this.fail(new QmpError(`QMP socket ${path} closed by QEMU`, 'Closed')));
  }

  /** Connects, waits for the greeting and negotiates (qmp_capabilities). Errors name the likely fix. */
  static async connect(socketPath: string, o: QmpConnectOptions = {}): Promise<QmpClient> {
    const timeoutMs = o.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    let st: fs.Stats;
    try {
      st = fs.statSync(socketPath);
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code === 'EACCES')
        throw new QmpError(`QMP socket ${socketPath}: permission denied; run as root or as the user QEMU runs as`, 'Connect');
      throw new QmpError(
        `QMP socket ${socketPath} does not exist: start QEMU with -qmp unix:${socketPath},server=on,wait=off (or give the right path)`,
        'Connect',
      );
    }
    if (!st.isSocket())
      throw new QmpError(`${socketPath} is not a Unix socket: give the path of QEMU's -qmp unix:PATH,server=on,wait=off`, 'Connect');
    const sock = await new Promise<net.Socket>((resolve, reject) => {
      const s = net.connect(socketPath);
      const timer = setTimeout(() => {
        s.destroy();
        reject(new QmpError(`QMP socket ${socketPath}: connect timed out`, 'Timeout'));
      }, timeoutMs);
      s.once('connect', () => {
        clearTimeout(timer);
        s.removeAllListeners('error');
        resolve(s);
      });
      s.once('error', (e: NodeJS.ErrnoException) => {
        clearTimeout(timer);
        const why =
          e.code === 'ECONNREFUSED'
            ? 'nothing is listening (QEMU not running, or a stale socket file)'
            : e.code === 'EACCES'
              ? 'permission denied; run as root or as the user QEMU runs as'
              : e.message;
        reject(new QmpError(`QMP socket ${socketPath}: ${why}`, 'Connect'));
      });
    });
    const c = new QmpClient(sock, socketPath, timeoutMs, o.maxLine ?? QMP_MAX_LINE);
    try {
      const noGreeting = `${socketPath} sent no QMP greeting within ${timeoutMs} ms: is it QEMU's -qmp socket (not a -monitor or another program's)?`;
      await c.reply(GREETING, timeoutMs, noGreeting);
      await c.execute('qmp_capabilities');
    } catch (e) {
      c.close();
      throw e;
    }
    return c;
  }

  /** Pid, uid and gid of the process that created the listening socket (SO_PEERCRED). */
  peerCredentials(): { pid: number; uid: number; gid: number } {
    const fd = socketFd(this.sock);
    if (fd === undefined) throw new QmpError(`QMP socket ${this.path}: no file descriptor for SO_PEERCRED`, 'Closed');
    return getPeerCredentials(fd);
  }

  /** Runs a command; resolves with its "return" value, rejects with QmpError on an error reply or timeout. */
  execute(command: string, args?: Record<string, unknown>, timeoutMs = this.timeoutMs): Promise<unknown> {
    const id = `vmsr-${this.nextId++}`;
    const reply = this.reply(id, timeoutMs, `QMP ${command}: no reply within ${timeoutMs} ms from ${this.path}`);
    const msg = args === undefined ? { execute: command, id } : { execute: command, id, arguments: args };
    if (!this.failure) this.sock.write(`${JSON.stringify(msg)}\n`);
    return reply;
  }

  /** query-cpus-fast: each vCPU's host thread and its virtual socket (package). */
  async queryCpus(): Promise<QmpCpu[]> {
    const r = await this.execute('query-cpus-fast');
    if (!Array.isArray(r)) throw new QmpError('query-cpus-fast: reply is not a list', 'Protocol');
    return r.map((c: unknown, i) => {
      const o = c as { 'thread-id'?: unknown; props?: { 'socket-id'?: unknown } };
      const tid = o?.['thread-id'];
      if (typeof tid !== 'number' || !Number.isSafeInteger(tid) || tid <= 0) {
        throw new QmpError(`query-cpus-fast: entry ${i} has no valid thread-id: ${JSON.stringify(c)?.slice(0, 200)}`, 'Protocol');
      }
      const sock = o.props?.['socket-id'];
      return {
        threadId: tid,
        socketId: typeof sock === 'number' && Number.isSafeInteger(sock) && sock >= 0 ? sock : undefined,
      };
    });
  }

  async queryName(): Promise<string | undefined> {
    const r = (await this.execute('query-name')) as { name?: unknown } | null;
    return typeof r?.name === 'string' ? r.name : undefined;
  }

  close(): void {
    this.fail(new QmpError(`QMP connection to ${this.path} closed`, 'Closed'));
    this.sock.destroy();
  }

  /** Waits for the reply `id` (GREETING: the greeting); rejects with `timeout` after `ms`. */
  private reply(id: string, ms: number, timeout: string): Promise<unknown> {
    return new Promise((resolve, reject) => {
      if (this.failure) return reject(this.failure);
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new QmpError(timeout, 'Timeout'));
      }, ms);
      this.pending.set(id, { resolve, reject, timer });
    });
  }

  private take(id: string): Pending | undefined {
    const p = this.pending.get(id);
    this.pending.delete(id);
    if (p) clearTimeout(p.timer);
    return p;
  }

  private onData(d: string): void {
    this.buf += d;
    let nl: number;
    while ((nl = this.buf.indexOf('\n')) >= 0) {
      const line = this.buf.slice(0, nl).trim();
      this.buf = this.buf.slice(nl + 1);
      if (line !== '') this.onLine(line);
      if (this.failure) return;
    }
    if (this.buf.length > this.maxLine) {
      this.fail(new QmpError(`${this.path}: reply line longer than ${this.maxLine} bytes; not a QMP server?`, 'Protocol'));
      this.sock.destroy();
    }
  }

  private onLine(line: string): void {
    let msg: unknown;
    try {
      msg = JSON.parse(line);
    } catch {
      return this.protocolError(`not JSON: ${JSON.stringify(line.slice(0, 80))}`);
    }
    if (typeof msg !== 'object' || msg === null || Array.isArray(msg))
      return this.protocolError(`not a JSON object: ${JSON.stringify(line.slice(0, 80))}`);
    const o = msg as Record<string, unknown>;
    const greeting = this.take(GREETING);
    if (greeting) {
      if (typeof o.QMP === 'object' && o.QMP !== null) return greeting.resolve(o);
      const what = `first message is not a QMP greeting: ${JSON.stringify(line.slice(0, 80))}`;
      greeting.reject(new QmpError(`${this.path} is not a QMP socket: ${what}`, 'Protocol'));
      this.failure = new QmpError(`${this.path}: bad greeting`, 'Protocol');
      this.sock.destroy();
      return;
    }
    if ('event' in o) return; // asynchronous events are not ours to handle
    // A reply to nothing we asked (e.g. a late one after a timeout) is ignored: the command already failed.
    const p = typeof o.id === 'string' ? this.take(o.id) : undefined;
    if (!p) return;
    if ('return' in o) p.resolve(o.return);
    else if (typeof o.error === 'object' && o.error !== null) {
      const e = o.error as { class?: unknown; desc?: unknown };
      p.reject(
        new QmpError(
          `QMP error ${String(e.class ?? 'GenericError')}: ${String(e.desc ?? '(no description)').slice(0, 500)}`,
          String(e.class ?? 'GenericError'),
        ),
      );
    } else p.reject(new QmpError(`QMP reply with neither return nor error: ${JSON.stringify(line.slice(0, 80))}`, 'Protocol'));
  }

  private protocolError(what: string): void {
    this.fail(new QmpError(`${this.path}: ${what}; is it QEMU's -qmp socket?`, 'Protocol'));
    this.sock.destroy();
  }

  private fail(e: Error): void {
    if (this.failure) return;
    this.failure = e;
    for (const id of [...this.pending.keys()]) this.take(id)!.reject(e);
  }
}

/** vCPU threads (socket-id as vpkg) and name from QMP; the pid from SO_PEERCRED, refused unless it is the vCPUs' Tgid. */
export async function vmSpecFromQmp(socketPath: string, procRoot: string): Promise<VmSpec> {
  const qmp = await QmpClient.connect(socketPath);
  try {
    const pid = qmp.peerCredentials().pid;
    const cpus = await qmp.queryCpus();
    const name = await qmp.queryName();
    // Without socket-id (boards that give no props) every vCPU is in virtual package 0.
    const listed = checkVcpus(cpus.map((c): VcpuSpec => ({ tid: c.threadId, vpkg: c.socketId ?? 0 })));
    if (!listed.ok) throw new Error(`QMP ${socketPath}: query-cpus-fast: ${listed.error}`);
    const vcpus = listed.value;
    try {
      checkThreadsOf(procRoot, pid, vcpus);
    } catch (e) {
      throw new Error(`QMP ${socketPath}: the socket's owner (pid ${pid}) is not the QEMU running these vCPUs: ${(e as Error).message}`);
    }
    const starttime = readStarttime(procRoot, pid);
    if (starttime === null) throw new Error(`QMP ${socketPath}: QEMU process ${pid} vanished`);
    return { pid, starttime, vcpus, ...(name !== undefined ? { name } : {}) };
  } finally {
    qmp.close();
  }
}
