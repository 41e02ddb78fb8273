/**
 * v2 client library: what `vmsr-helper watch`, the tests and a VMM embedding the protocol use.
 * Replies come back in request order; UPDATEs (and ERROR 5 notices for subscriptions) may arrive
 * at any time in between and go to the subscription's callbacks.
 */
import fs from 'node:fs';
import net from 'node:net';
import {
  E,
  FrameDecoder,
  HELPER_TYPES,
  T,
  V2_MAGIC,
  encodeHostSubscribe,
  encodeList,
  encodeObserve,
  encodeRead,
  encodeRegister,
  encodeSubscribe,
  encodeUnobserve,
  encodeUnregister,
  errorCodeName,
  typeName,
  type HostPackageValues,
  type HostStats,
  type HostValues,
  type VmEntry,
  type VpkgValue,
} from '../protocol/v2/codec.js';
import { parseHelperFrame, type HelperMessage } from '../protocol/v2/messages.js';
import type { VcpuSpec } from '../ratio/types.js';
import { cannot } from '../common/errors.js';
import { DEFAULT_HELPER_SOCKET } from '../protocol/socket-path.js';

export type { HostPackageValues, HostStats, VpkgValue };

/** An ERROR frame from the helper. */
export class V2Error extends Error {
  constructor(
    readonly code: number,
    readonly requestType: number,
    readonly helperMessage: string,
  ) {
    super(`${typeName(requestType)}: ${errorCodeName(code)} (error ${code}): ${helperMessage}`);
    this.name = 'V2Error';
  }
}

/** The helper could not be reached, or the connection broke. */
export class V2ConnectionError extends Error {
  constructor(
    message: string,
    readonly code?: string,
  ) {
    super(message);
    this.name = 'V2ConnectionError';
  }
}

export interface Registered {
  vmId: number;
  nvpkg: number;
  /** The MSR_RAPL_POWER_UNIT a guest should see. */
  powerUnit: bigint;
}

/** One virtual package's values (VALUE), as the protocol decodes them. */
export type Value = Omit<Extract<HelperMessage, { type: typeof T.VALUE }>, 'type'>;

export interface Update {
  vmId: number;
  tNs: bigint;
  /** Index = vpkg. */
  vpkgs: VpkgValue[];
  ended: boolean;
}

/** One VM as LIST shows it (docs/protocol-v2.md "VM_LIST"). */
export interface VmInfo {
  /** Host-wide id: OBSERVE takes it; for a registered VM it is also the registrant's vm_id. */
  hostVmId: number;
  pid: number;
  /** Owner of the VM's process. */
  uid: number;
  /** Field 22 of /proc/<pid>/stat: (pid, starttime) names the process across pid reuse. */
  starttime: bigint;
  name: string | null;
  /** Lowercase 8-4-4-4-12 form. */
  uuid: string | null;
  source: 'registered' | 'discovered';
  nvpkg: number;
  ended: boolean;
  /** The vCPU threads could not be told apart: vpkg 0 holds the whole VM's energy. */
  wholeVmOnly: boolean;
}

/** An OBSERVE update: the same values as a SUBSCRIBE update, named by host-wide id. */
export interface VmUpdate {
  hostVmId: number;
  tNs: bigint;
  ended: boolean;
  vpkgs: VpkgValue[];
}

/**
 * A HOST_UPDATE: each package's energy and, from a helper that sends it, the part attributed to no VM
 * (else null); tNs is the sample's CLOCK_MONOTONIC (age = now - tNs on this host); vmsChanged: a VM
 * appeared, ended or was dropped since the previous sample, LIST again.
 */
export type HostUpdate = HostValues;

/** 16 raw bytes as a lowercase 8-4-4-4-12 UUID. */
export function formatUuid(b: Buffer): string {
  const h = b.toString('hex');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20, 32)}`;
}

function toVmInfo(e: VmEntry): VmInfo {
  return {
    hostVmId: e.hostVmId,
    pid: e.pid,
    uid: e.uid,
    starttime: e.starttime,
    name: e.name,
    uuid: e.uuid === null ? null : formatUuid(e.uuid),
    source: e.discovered ? 'discovered' : 'registered',
    nvpkg: e.nvpkg,
    ended: e.ended,
    wholeVmOnly: e.wholeVmOnly,
  };
}

interface Pending {
  type: number;
  vmId?: number;
  resolve: (m: HelperMessage) => void;
  reject: (e: Error) => void;
}

interface Subscription {
  onUpdate: (u: Update) => void;
  onError?: (e: V2Error) => void;
}

/** Request types each reply type answers (UPDATE and HOST_UPDATE acknowledgments are matched apart). */
const REPLY_OF: Record<number, readonly number[]> = {
  [T.REGISTERED]: [T.REGISTER],
  [T.VALUE]: [T.READ],
  [T.OK]: [T.UNREGISTER, T.UNOBSERVE],
  [T.VM_LIST]: [T.LIST],
};

/** Pages one list() may read: 2^32 ids at one VM a page cannot loop forever on a lying helper. */
const MAX_LIST_PAGES = 100_000;

export class V2Client {
  private readonly decoder = new FrameDecoder(HELPER_TYPES);
  private readonly pending: Pending[] = [];
  private readonly subs = new Map<number, Subscription>();
  private hostSub: { onUpdate: (u: HostUpdate) => void; onError?: (e: V2Error) => void } | null = null;
  private failure: Error | null = null;
  /** No byte from the helper yet: the first ones tell whether it speaks v2 at all. */
  private silent = true;
  /** Frames of requests made in the current tick, written together on the next one. */
  private outbox: Buffer[] = [];
  /** Resolves when the connection is closed, with the reason when it broke. */
  readonly closed: Promise<Error | null>;
  private resolveClosed!: (e: Error | null) => void;

  private constructor(
    private readonly socket: net.Socket,
    private readonly socketPath: string,
  ) {
    this.closed = new Promise((r) => (this.resolveClosed = r));
    socket.on('data', (d: Buffer) => this.onData(d));
    socket.on('error', (e: NodeJS.ErrnoException) => this.shutdown(new V2ConnectionError(`helper connection: ${e.message}`, e.code)));
    socket.on('close', () => {
      // Closed without a byte while a request waited: a legacy-only helper (QEMU's own
      // qemu-vmsr-helper, also at /run/qemu-vmsr-helper.sock) reads "VMS2" as an MSR number it
      // refuses, and closes silently.
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
      const socket = net.createConnection({ path: socketPath });
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
        resolve(new V2Client(socket, socketPath));
      });
    });
  }

  async register(o: { pid?: number; vcpus: readonly VcpuSpec[] }): Promise<Registered> {
    const m = await this.call(T.REGISTER, encodeRegister({ pid: o.pid ?? 0, vcpus: o.vcpus }));
    if (m.type !== T.REGISTERED) throw this.unexpected(m);
    return { vmId: m.vmId, nvpkg: m.nvpkg, powerUnit: m.powerUnit };
  }

  async read(vmId: number, vpkg: number): Promise<Value> {
    const m = await this.call(T.READ, encodeRead(vmId, vpkg), vmId);
    if (m.type !== T.VALUE) throw this.unexpected(m);
    const { type: _t, ...v } = m;
    return v;
  }

  /**
   * Subscribes; resolves with the helper's immediate UPDATE (the current values). `onUpdate` gets that
   * one and one after every sample until the VM ends (`ended` true, last one), is unregistered, or the
   * connection closes. `onError` gets ERROR 5 notices while the helper's energy source fails.
   */
  async subscribe(vmId: number, onUpdate: (u: Update) => void, onError?: (e: V2Error) => void): Promise<Update> {
    this.subs.set(vmId, { onUpdate, onError });
    try {
      const m = await this.call(T.SUBSCRIBE, encodeSubscribe(vmId), vmId);
      if (m.type !== T.UPDATE) throw this.unexpected(m);
      return toUpdate(m);
    } catch (e) {
      this.subs.delete(vmId);
      throw e;
    }
  }

  /** Every VM this peer may see (all pages), ascending host id. */
  async list(): Promise<VmInfo[]> {
    const out: VmInfo[] = [];
    let from = 0;
    for (let page = 0; page < MAX_LIST_PAGES; page++) {
      const m = await this.call(T.LIST, encodeList(from));
      if (m.type !== T.VM_LIST) throw this.unexpected(m);
      for (const e of m.entries) out.push(toVmInfo(e));
      if (m.nextId === 0) return out;
      if (m.nextId <= from) throw new V2ConnectionError(`helper sent VM_LIST next_id ${m.nextId}, not after ${from}`);
      from = m.nextId;
    }
    throw new V2ConnectionError(`helper sent more than ${MAX_LIST_PAGES} VM_LIST pages`);
  }

  /**
   * Observes any VM this peer may see (discovered, or registered by anyone); resolves with the
   * immediate update. Updates follow every sample until the VM ends (last one has `ended`),
   * unobserve(), or close. A VM it may not see is refused like a nonexistent one (ERROR 3).
   */
  async observe(hostVmId: number, onUpdate: (u: VmUpdate) => void, onError?: (e: V2Error) => void): Promise<VmUpdate> {
    const toVm = (u: Update): VmUpdate => ({ hostVmId: u.vmId, tNs: u.tNs, ended: u.ended, vpkgs: u.vpkgs });
    this.subs.set(hostVmId, { onUpdate: (u) => onUpdate(toVm(u)), onError });
    try {
      const m = await this.call(T.OBSERVE, encodeObserve(hostVmId), hostVmId);
      if (m.type !== T.UPDATE) throw this.unexpected(m);
      return toVm(toUpdate(m));
    } catch (e) {
      this.subs.delete(hostVmId);
      throw e;
    }
  }

  async unobserve(hostVmId: number): Promise<void> {
    const m = await this.call(T.UNOBSERVE, encodeUnobserve(hostVmId), hostVmId);
    if (m.type !== T.OK) throw this.unexpected(m);
    this.subs.delete(hostVmId);
  }

  /**
   * Host-wide values after every sample: each package's energy and the part of it attributed to no
   * VM, the energy attributed to no VM on all packages, and the helper's health. Resolves with the
   * immediate update. Needs root or the observer group (ERROR 2). A helper that predates per-package
   * unattributed energy refuses the flag asking for it (ERROR 1, the connection stays): the
   * subscription is then made without it, and every package's `unattributedUj` is null.
   */
  async subscribeHost(onUpdate: (u: HostUpdate) => void, onError?: (e: V2Error) => void): Promise<HostUpdate> {
    this.hostSub = { onUpdate, onError };
    try {
      let m: HelperMessage;
      try {
        m = await this.call(T.HOST_SUBSCRIBE, encodeHostSubscribe({ perPackage: true }));
      } catch (e) {
        if (!(e instanceof V2Error && e.code === E.MALFORMED && e.requestType === T.HOST_SUBSCRIBE)) throw e;
        m = await this.call(T.HOST_SUBSCRIBE, encodeHostSubscribe({ perPackage: false }));
      }
      if (m.type !== T.HOST_UPDATE) throw this.unexpected(m);
      const { type: _t, ...u } = m;
      return u;
    } catch (e) {
      this.hostSub = null;
      throw e;
    }
  }

  async unregister(vmId: number): Promise<void> {
    const m = await this.call(T.UNREGISTER, encodeUnregister(vmId), vmId);
    if (m.type !== T.OK) throw this.unexpected(m);
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

  private call(type: number, frame: Buffer, vmId?: number): Promise<HelperMessage> {
    if (this.failure) return Promise.reject(this.failure);
    if (this.socket.destroyed) return Promise.reject(new V2ConnectionError('the helper connection is closed'));
    return new Promise((resolve, reject) => {
      this.pending.push({ type, vmId, resolve, reject });
      this.enqueue(frame);
    });
  }

  /**
   * Requests made in the same tick leave in one write, so the helper handles them with no sample in
   * between (e.g. final READs and their UNREGISTER under Promise.all). One Buffer, not cork(): a
   * corked stream still splits its buffer when a write is in flight at uncork.
   */
  private enqueue(bytes: Buffer): void {
    this.outbox.push(bytes);
    if (this.outbox.length > 1) return;
    process.nextTick(() => {
      const batch = this.outbox;
      this.outbox = [];
      if (!this.socket.destroyed) this.socket.write(batch.length === 1 ? batch[0]! : Buffer.concat(batch));
    });
  }

  private unexpected(m: HelperMessage): Error {
    return new V2ConnectionError(`unexpected ${typeName(m.type)} from the helper`);
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
    for (const f of this.decoder.push(data)) {
      if (!f.ok) return this.broken(`helper sent a bad frame: ${f.error.message} (is ${this.socketPath} a vmsr-helper socket?)`);
      const m = parseHelperFrame(f.value);
      if (!m.ok) return this.broken(`helper sent a bad frame: ${m.error}`);
      this.dispatch(m.value);
    }
  }

  private dispatch(m: HelperMessage): void {
    const head = this.pending[0];
    if (m.type === T.UPDATE) {
      this.subs.get(m.vmId)?.onUpdate(toUpdate(m));
      if (m.ended) this.subs.delete(m.vmId);
      if ((head?.type === T.SUBSCRIBE || head?.type === T.OBSERVE) && head.vmId === m.vmId) this.pending.shift()!.resolve(m);
      return;
    }
    if (m.type === T.HOST_UPDATE) {
      const { type: _t, ...u } = m;
      this.hostSub?.onUpdate(u);
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
        return;
      }
      // An error not answering our request (e.g. the helper closing on a frame it refused).
      this.failure = err;
      for (const p of this.pending.splice(0)) p.reject(err);
      return;
    }
    if (!head || !REPLY_OF[m.type]?.includes(head.type)) return this.broken(`unexpected ${typeName(m.type)} from the helper`);
    this.pending.shift()!.resolve(m);
  }

  private broken(message: string): void {
    this.shutdown(new V2ConnectionError(message));
    this.socket.destroy();
  }

  private shutdown(err: Error | null): void {
    if (err && !this.failure) this.failure = err;
    const reason = this.failure ?? new V2ConnectionError('the helper closed the connection');
    for (const p of this.pending.splice(0)) p.reject(reason);
    if (this.socket.destroyed || err) this.resolveClosed(err ?? this.failure);
  }
}

/**
 * What to do about EACCES on the helper's socket, from its owner, group and mode: the shipped .socket
 * unit makes it root:kvm 0660, so membership of that group is the usual fix.
 */
export function socketAccessHint(socketPath: string, groupFile = '/etc/group'): string {
  let st: fs.Stats;
  try {
    st = fs.statSync(socketPath);
  } catch {
    return 'run as root, or as a member of the socket\'s group';
  }
  const mode = (st.mode & 0o777).toString(8).padStart(4, '0');
  const group = groupName(st.gid, groupFile) ?? String(st.gid);
  if ((st.mode & 0o060) === 0o060) {
    return `the socket is mode ${mode}, group ${group}: add this user to group ${group} (usermod -aG ${group} USER, then log in again), or run as root`;
  }
  return `the socket is mode ${mode}, group ${group}, so only its owner connects: give the group access (the shipped qemu-vmsr-helper.socket sets SocketGroup=kvm, SocketMode=0660), or run as root`;
}

function groupName(gid: number, groupFile: string): string | undefined {
  try {
    for (const line of fs.readFileSync(groupFile, 'utf8').split('\n')) {
      const f = line.split(':');
      if (f.length >= 3 && f[2] === String(gid) && f[0]) return f[0];
    }
  } catch {
    /* no group database: show the number */
  }
  return undefined;
}

function toUpdate(m: Extract<HelperMessage, { type: typeof T.UPDATE }>): Update {
  return { vmId: m.vmId, tNs: m.tNs, vpkgs: m.vpkgs, ended: m.ended };
}
