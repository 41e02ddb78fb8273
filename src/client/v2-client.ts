/** The v2 client: replies in request order, UPDATEs and ERROR 5 notices to the subscriptions, fds paired with their frame (docs/stats-fd.md). */
import type { EnergyDomain } from '../model/domains.js';
import fs from 'node:fs';
import net from 'node:net';
import { V2_MAGIC } from '../protocol/legacy.js';
import {
  E,
  HELPER_TYPES,
  T,
  encodeHostSubscribe,
  encodeU32Frame,
  encodeObserve,
  encodeRead,
  encodeRegister,
  encodeLimit,
  type LimitState,
  encodeSubscribe,
  typeName,
} from '../protocol/v2/codec.js';
import { FrameDecoder } from '../protocol/v2/frame-decoder.js';
import { parseHelperFrame, type HelperMessage } from '../protocol/v2/messages.js';
import type { VcpuSpec } from '../model/vcpus.js';
import { cannot } from '../common/errors.js';
import { closeFd, dupCloexec, watchReadable, type FdWatch } from '../os/libc/fds.js';
import { MSG_DONTWAIT, recvWithFds, socketFd } from '../os/libc/sockets.js';
import { groupNameOf } from '../os/privileges/accounts.js';
import { readProcFileOr } from '../os/proc-file.js';
import { DEFAULT_HELPER_SOCKET } from '../protocol/socket-path.js';
import {
  toVmInfo,
  V2ConnectionError,
  V2Error,
  type HostUpdate,
  type Registered,
  type SubscribeOptions,
  type Update,
  type Value,
  type VmInfo,
  type VmUpdate,
} from './v2-replies.js';

interface Pending {
  type: number;
  vmId?: number;
  /** The reply comes with one fd (requestWithFd); resolve then gets it. */
  expectsFd?: boolean;
  resolve: (m: HelperMessage, fd?: number) => void;
  reject: (e: Error) => void;
}

/** Bytes one onread chunk may hold: a whole frame of the largest payload, and its header. */
const READ_CHUNK = 64 * 1024 + 8;

interface Subscription<U = Update> {
  onUpdate: (u: U) => void;
  onError?: (e: V2Error) => void;
}

/** Request types each reply type answers (UPDATE and HOST_UPDATE acknowledgments are matched apart). */
const REPLY_OF: Record<number, readonly number[]> = {
  [T.REGISTERED]: [T.REGISTER],
  [T.VALUE]: [T.READ],
  [T.OK]: [T.UNREGISTER, T.UNOBSERVE],
  [T.VM_LIST]: [T.LIST],
  [T.STATS_FD_REPLY]: [T.STATS_FD],
  [T.LIMIT_STATE]: [T.LIMIT],
};

/** `m` as the reply of type `type`; anything else is a broken helper. */
function replyOf<K extends HelperMessage['type']>(m: HelperMessage, type: K): Extract<HelperMessage, { type: K }> {
  if (m.type !== type) throw new V2ConnectionError(`unexpected ${typeName(m.type)} from the helper`);
  return m as Extract<HelperMessage, { type: K }>;
}

function fieldsOf<M extends { type: number }>({ type: _t, ...fields }: M): Omit<M, 'type'> {
  return fields;
}

/** Pages one list() may read: 2^32 ids at one VM a page cannot loop forever on a lying helper. */
const MAX_LIST_PAGES = 100_000;

export class V2Client {
  private readonly decoder = new FrameDecoder(HELPER_TYPES);
  private readonly pending: Pending[] = [];
  private readonly subs = new Map<number, Subscription>();
  private hostSub: Subscription<HostUpdate> | null = null;
  private failure: Error | null = null;
  /** No byte from the helper yet: the first ones tell whether it speaks v2 at all. */
  private silent = true;
  private outbox: Buffer[] = [];
  /** Resolves when the connection is closed, with the reason when it broke. */
  readonly closed: Promise<Error | null>;
  private resolveClosed!: (e: Error | null) => void;

  /** While a request waits for an fd: the duplicate fd read with recvmsg, its watch, and the fd of the frame being read. */
  private fdReader: { fd: number; watch: FdWatch; frameFd: number | null } | null = null;

  private constructor(
    private readonly socket: net.Socket,
    private readonly socketPath: string,
    reader: { onBytes: (b: Buffer) => void },
  ) {
    this.closed = new Promise((r) => (this.resolveClosed = r));
    reader.onBytes = (d) => this.onData(d);
    socket.on('error', (e: NodeJS.ErrnoException) => this.shutdown(new V2ConnectionError(`helper connection: ${e.message}`, e.code)));
    socket.on('close', () => {
      // Closed without a byte while a request waited: QEMU's own helper refuses "VMS2" as an MSR number, silently.
      if (this.silent && this.pending.length > 0 && !this.failure) {
        this.failure = new V2ConnectionError(
          `${this.socketPath} closed the connection without answering: it does not speak the v2 protocol (QEMU's own qemu-vmsr-helper only speaks the legacy one); run vmsr-helper there (systemctl status qemu-vmsr-helper shows which ExecStart runs)`,
        );
      }
      this.shutdown(null);
    });
  }

  /** Connects to the helper's socket and selects v2. */
  static connect(socketPath: string, opts: { timeoutMs?: number } = {}): Promise<V2Client> {
    return new Promise((resolve, reject) => {
      // The buffer is reused: the decoder copies what it keeps.
      const reader = { onBytes: (_b: Buffer) => {} };
      const socket = net.createConnection({
        path: socketPath,
        onread: {
          buffer: Buffer.alloc(READ_CHUNK),
          callback: (n: number, buf: Uint8Array) => (reader.onBytes(Buffer.from(buf.buffer, buf.byteOffset, n)), true),
        },
      });
      const timer = setTimeout(() => {
        socket.destroy();
        reject(new V2ConnectionError(`timed out connecting to ${socketPath}`, 'ETIMEDOUT'));
      }, opts.timeoutMs ?? 5000);
      socket.once('error', (e: NodeJS.ErrnoException) => {
        clearTimeout(timer);
        const hint =
          e.code === 'ENOENT' || e.code === 'ECONNREFUSED'
            ? `no helper is listening at ${socketPath} (${e.code}); start it with: vmsr-helper -k ${socketPath}`
            : e.code === 'EACCES'
              ? cannot(`connect to ${socketPath}`, `permission denied (EACCES)`, socketAccessHint(socketPath))
              : cannot(`connect to ${socketPath}`, e.message);
        reject(new V2ConnectionError(hint, e.code));
      });
      socket.once('connect', () => {
        clearTimeout(timer);
        socket.removeAllListeners('error');
        socket.write(V2_MAGIC);
        resolve(new V2Client(socket, socketPath, reader));
      });
    });
  }

  async register(o: { pid?: number; vcpus: readonly VcpuSpec[] }): Promise<Registered> {
    return fieldsOf(replyOf(await this.call(T.REGISTER, encodeRegister({ pid: o.pid ?? 0, vcpus: o.vcpus })), T.REGISTERED));
  }

  async read(vmId: number, vpkg: number): Promise<Value> {
    return fieldsOf(replyOf(await this.call(T.READ, encodeRead(vmId, vpkg), vmId), T.VALUE));
  }

  /** Resolves with the immediate UPDATE; `onUpdate` gets it and one per sample until the end; `onError`, ERROR 5 notices. */
  async subscribe(vmId: number, onUpdate: (u: Update) => void, onError?: (e: V2Error) => void, o: SubscribeOptions = {}): Promise<Update> {
    return this.follow(T.SUBSCRIBE, vmId, { onUpdate, onError }, o, (domains) => encodeSubscribe(vmId, { domains }));
  }

  /** Every VM this peer may see (all pages), ascending host id. */
  async list(): Promise<VmInfo[]> {
    const out: VmInfo[] = [];
    let from = 0;
    for (let page = 0; page < MAX_LIST_PAGES; page++) {
      const m = replyOf(await this.call(T.LIST, encodeU32Frame(T.LIST, from)), T.VM_LIST);
      for (const e of m.entries) out.push(toVmInfo(e));
      if (m.nextId === 0) return out;
      if (m.nextId <= from) throw new V2ConnectionError(`helper sent VM_LIST next_id ${m.nextId}, not after ${from}`);
      from = m.nextId;
    }
    throw new V2ConnectionError(`helper sent more than ${MAX_LIST_PAGES} VM_LIST pages`);
  }

  /** subscribe() for any VM this peer may see, until unobserve(); one it may not see is refused as nonexistent (ERROR 3). */
  async observe(
    hostVmId: number,
    onUpdate: (u: VmUpdate) => void,
    onError?: (e: V2Error) => void,
    o: SubscribeOptions = {},
  ): Promise<VmUpdate> {
    const toVm = ({ vmId, ...u }: Update): VmUpdate => ({ hostVmId: vmId, ...u });
    const sub = { onUpdate: (u: Update) => onUpdate(toVm(u)), onError };
    return toVm(await this.follow(T.OBSERVE, hostVmId, sub, o, (domains) => encodeObserve(hostVmId, { domains })));
  }

  /** SUBSCRIBE or OBSERVE: `sub` gets the VM's UPDATEs from now on; the immediate one, or the refusal (then `sub` is dropped). */
  private async follow(
    type: number,
    vmId: number,
    sub: Subscription,
    o: SubscribeOptions,
    frame: (domains: boolean) => Buffer,
  ): Promise<Update> {
    this.subs.set(vmId, sub);
    try {
      const frames = o.domains === true ? [frame(true), frame(false)] : [frame(false)];
      return fieldsOf(replyOf(await this.withFallback(type, frames, vmId), T.UPDATE));
    } catch (e) {
      this.subs.delete(vmId);
      throw e;
    }
  }

  /** `type` with each of `frames` in turn while the helper refuses a flag of it (ERROR 1: it predates the flag). */
  private async withFallback(type: number, frames: readonly Buffer[], vmId?: number): Promise<HelperMessage> {
    for (let i = 0; ; i++) {
      try {
        return await this.call(type, frames[i]!, vmId);
      } catch (e) {
        const refused = e instanceof V2Error && e.code === E.MALFORMED && e.requestType === type;
        if (!refused || i === frames.length - 1) throw e;
      }
    }
  }

  async unobserve(hostVmId: number): Promise<void> {
    replyOf(await this.call(T.UNOBSERVE, encodeU32Frame(T.UNOBSERVE, hostVmId), hostVmId), T.OK);
    this.subs.delete(hostVmId);
  }

  /** Host values at every sample, root or observer group only (ERROR 2); flags an older helper refuses dropped: `domains`, then per-package unattributed (null). */
  async subscribeHost(onUpdate: (u: HostUpdate) => void, onError?: (e: V2Error) => void, o: SubscribeOptions = {}): Promise<HostUpdate> {
    this.hostSub = { onUpdate, onError };
    try {
      const tries = [...(o.domains === true ? [{ perPackage: true, domains: true }] : []), { perPackage: true }, { perPackage: false }];
      const frames = tries.map((t) => encodeHostSubscribe(t));
      return fieldsOf(replyOf(await this.withFallback(T.HOST_SUBSCRIBE, frames), T.HOST_UPDATE));
    } catch (e) {
      this.hostSub = null;
      throw e;
    }
  }

  /** A read-only fd of VM `hostVmId`'s statistics file, or the host's (0), for StatsReader: valid after the close and the VM's end. */
  async statsFd(hostVmId: number): Promise<{ fd: number; fileSize: number }> {
    const { reply, fd } = await this.requestWithFd(T.STATS_FD, encodeU32Frame(T.STATS_FD, hostVmId));
    if (reply.type !== T.STATS_FD_REPLY || reply.vmId !== hostVmId) {
      closeFd(fd);
      throw new V2ConnectionError(`the helper answered STATS_FD ${hostVmId} with ${typeName(reply.type)}`);
    }
    return { fd, fileSize: reply.fileSize };
  }

  /** VM `hostVmId`'s limit on `domain`: `watts` sets it (null removes; root and --socket-group), else reads; package's in the pre-domain layout. */
  async limit(hostVmId: number, watts?: number | null, domain?: EnergyDomain): Promise<LimitState> {
    const mw = watts === undefined ? undefined : watts === null ? 0 : Math.max(1, Math.round(watts * 1000));
    const frame = encodeLimit(hostVmId, mw, domain === 'package' ? undefined : domain);
    return fieldsOf(replyOf(await this.call(T.LIMIT, frame, hostVmId), T.LIMIT_STATE));
  }

  async unregister(vmId: number): Promise<void> {
    replyOf(await this.call(T.UNREGISTER, encodeU32Frame(T.UNREGISTER, vmId), vmId), T.OK);
    this.subs.delete(vmId);
  }

  /** Closes the connection; the helper unregisters this connection's VMs. */
  async close(): Promise<void> {
    if (!this.socket.destroyed) {
      // Requests still in the outbox go out before the end, not after it.
      if (this.outbox.length) this.socket.write(Buffer.concat(this.outbox.splice(0)));
      this.socket.end();
    }
    const t = setTimeout(() => this.socket.destroy(), 1000);
    await this.closed;
    clearTimeout(t);
  }

  /** Sends raw bytes (tests of hostile input). */
  writeRaw(bytes: Buffer): void {
    this.enqueue(bytes);
  }

  /** A request whose reply carries one fd, the caller's then; without it rejects, an fd on another frame breaks the connection. */
  requestWithFd(type: number, frame: Buffer): Promise<{ reply: HelperMessage; fd: number }> {
    return new Promise((resolve, reject) => {
      const resolveWithFd = (reply: HelperMessage, fd?: number) => {
        if (fd !== undefined) resolve({ reply, fd });
        else
          reject(
            new V2ConnectionError(`the helper answered ${typeName(type)} with ${typeName(reply.type)} but without the fd it should carry`),
          );
      };
      this.send({ type, expectsFd: true, resolve: resolveWithFd, reject }, frame);
    });
  }

  /** Stops Node's reading and reads with recvmsg from a duplicate of the socket's fd. */
  private startFdReading(): void {
    if (this.fdReader) return;
    const own = socketFd(this.socket);
    if (own === undefined) throw new V2ConnectionError('the helper connection has no fd to receive fds on');
    this.socket.pause();
    const fd = dupCloexec(own);
    if (fd < 0) {
      this.socket.resume();
      throw new V2ConnectionError(
        cannot('receive an fd from the helper', `no fd left to read the connection with (errno ${-fd})`, 'raise the fd limit (ulimit -n)'),
      );
    }
    this.fdReader = { fd, watch: watchReadable(fd, () => this.readWithFds()), frameFd: null };
  }

  private stopFdReading(): void {
    const r = this.fdReader;
    if (!r) return;
    this.fdReader = null;
    r.watch.close();
    closeFd(r.fd);
    if (r.frameFd !== null) closeFd(r.frameFd);
    if (!this.socket.destroyed) this.socket.resume();
  }

  /** Reads what is there, never past the end of the current frame, pairing an fd with the frame it starts. */
  private readWithFds(): void {
    for (let r = this.fdReader; r !== null && r === this.fdReader;) {
      const atFrameStart = this.decoder.incompleteBytes === 0;
      let got: { data: Buffer; fds: number[]; truncated: boolean };
      try {
        got = recvWithFds(r.fd, this.decoder.bytesToFrameEnd, 1, MSG_DONTWAIT);
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code === 'EAGAIN') return;
        // Node's own read reports the error, and the close.
        return this.stopFdReading();
      }
      // End of stream: Node reads it again and closes as for any connection.
      if (got.data.length === 0) {
        for (const fd of got.fds) closeFd(fd);
        return this.stopFdReading();
      }
      if (got.fds.length > 0 || got.truncated) {
        if (got.truncated || !atFrameStart) {
          for (const fd of got.fds) closeFd(fd);
          return this.broken(got.truncated ? 'helper sent more than one fd with a frame' : 'helper sent an fd in the middle of a frame');
        }
        r.frameFd = got.fds[0]!;
      }
      this.silent = false;
      this.decodeAndDispatch(got.data);
    }
  }

  private call(type: number, frame: Buffer, vmId?: number): Promise<HelperMessage> {
    return new Promise((resolve, reject) => this.send({ type, vmId, resolve, reject }, frame));
  }

  /** Called in a Promise executor: a connection that can send no request throws, so rejects. */
  private send(p: Pending, frame: Buffer): void {
    if (this.failure) throw this.failure;
    if (this.socket.destroyed) throw new V2ConnectionError('the helper connection is closed');
    if (p.expectsFd) this.startFdReading();
    this.pending.push(p);
    this.enqueue(frame);
  }

  /** One write for a tick's requests, so no sample falls between them; not cork(), which splits it while a write is in flight. */
  private enqueue(bytes: Buffer): void {
    this.outbox.push(bytes);
    if (this.outbox.length > 1) return;
    process.nextTick(() => {
      const batch = this.outbox;
      this.outbox = [];
      if (!this.socket.destroyed) this.socket.write(batch.length === 1 ? batch[0]! : Buffer.concat(batch));
    });
  }

  private onData(data: Buffer): void {
    if (this.silent && data.length > 0) {
      this.silent = false;
      // Every helper frame starts with a u16 type whose low byte is 0x81..0x84 or 0xff; '{' is text.
      if (data[0] === 0x7b) {
        const qmp = data.subarray(0, 16).toString('latin1').startsWith('{"QMP"');
        return this.broken(
          qmp
            ? `${this.socketPath} is a QEMU monitor (QMP) socket, not a vmsr-helper socket; give the helper's socket with -k (default ${DEFAULT_HELPER_SOCKET}) and a QMP socket with --qmp`
            : `${this.socketPath} is not a vmsr-helper socket (it sent text: ${JSON.stringify(data.subarray(0, 24).toString('latin1'))}); give the helper's socket with -k`,
        );
      }
    }
    this.decodeAndDispatch(data);
  }

  private decodeAndDispatch(data: Buffer): void {
    for (const f of this.decoder.push(data)) {
      if (!f.ok) return this.broken(`helper sent a bad frame: ${f.error.message} (is ${this.socketPath} a vmsr-helper socket?)`);
      // Read frame by frame while fds may come (readWithFds): the fd, if any, came with this frame.
      const fd = this.fdReader?.frameFd ?? undefined;
      if (this.fdReader) this.fdReader.frameFd = null;
      const m = parseHelperFrame(f.value);
      if (!m.ok) {
        if (fd !== undefined) closeFd(fd);
        return this.broken(`helper sent a bad frame: ${m.error}`);
      }
      this.dispatch(m.value, fd);
    }
  }

  private dispatch(m: HelperMessage, fd?: number): void {
    const head = this.pending[0];
    if (fd !== undefined) {
      if (!head?.expectsFd || !REPLY_OF[m.type]?.includes(head.type)) {
        closeFd(fd);
        return this.broken(`helper sent an fd with ${typeName(m.type)}, which carries none`);
      }
      this.pending.shift()!.resolve(m, fd);
      return this.fdRequestDone();
    }
    if (m.type === T.UPDATE) {
      this.subs.get(m.vmId)?.onUpdate(fieldsOf(m));
      if (m.ended) this.subs.delete(m.vmId);
      if ((head?.type === T.SUBSCRIBE || head?.type === T.OBSERVE) && head.vmId === m.vmId) this.pending.shift()!.resolve(m);
      return;
    }
    if (m.type === T.HOST_UPDATE) {
      this.hostSub?.onUpdate(fieldsOf(m));
      if (head?.type === T.HOST_SUBSCRIBE) this.pending.shift()!.resolve(m);
      return;
    }
    if (m.type === T.ERROR) {
      const err = new V2Error(m.code, m.requestType, m.message);
      // ERROR 5 about subscriptions is a notice, never a reply (SUBSCRIBE is answered with UPDATE).
      if (m.code === E.ENERGY_SOURCE && m.requestType === T.SUBSCRIBE) {
        for (const s of this.subs.values()) s.onError?.(err);
        this.hostSub?.onError?.(err);
        return;
      }
      if (head && head.type === m.requestType) {
        this.pending.shift()!.reject(err);
        if (head.expectsFd) this.fdRequestDone();
        return;
      }
      // An error not answering our request (e.g. the helper closing on a frame it refused).
      this.failure = err;
      for (const p of this.pending.splice(0)) p.reject(err);
      return;
    }
    if (!head || !REPLY_OF[m.type]?.includes(head.type)) return this.broken(`unexpected ${typeName(m.type)} from the helper`);
    this.pending.shift()!.resolve(m);
    if (head.expectsFd) this.fdRequestDone();
  }

  /** Back to Node's reading once no request waits for an fd. */
  private fdRequestDone(): void {
    if (!this.pending.some((p) => p.expectsFd)) this.stopFdReading();
  }

  private broken(message: string): void {
    this.shutdown(new V2ConnectionError(message));
    this.socket.destroy();
  }

  private shutdown(err: Error | null): void {
    this.stopFdReading();
    if (err && !this.failure) this.failure = err;
    const reason = this.failure ?? new V2ConnectionError('the helper closed the connection');
    for (const p of this.pending.splice(0)) p.reject(reason);
    if (this.socket.destroyed || err) this.resolveClosed(err ?? this.failure);
  }
}

/** The fix for EACCES on the helper's socket, from its group and mode (the shipped .socket unit: root:kvm 0660). */
export function socketAccessHint(socketPath: string, groupFile = '/etc/group'): string {
  let st: fs.Stats;
  try {
    st = fs.statSync(socketPath);
  } catch {
    return "run as root, or as a member of the socket's group";
  }
  const mode = (st.mode & 0o777).toString(8).padStart(4, '0');
  const group = groupNameOf(st.gid, readProcFileOr(groupFile, 'utf8') ?? '') ?? String(st.gid);
  if ((st.mode & 0o060) === 0o060) {
    return `the socket is mode ${mode}, group ${group}: add this user to group ${group} (usermod -aG ${group} USER, then log in again), or run as root`;
  }
  return `the socket is mode ${mode}, group ${group}, so only its owner connects: give the group access (the shipped qemu-vmsr-helper.socket sets SocketGroup=kvm, SocketMode=0660), or run as root`;
}
