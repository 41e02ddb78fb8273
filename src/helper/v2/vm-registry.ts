/** Who may register what, and how much: the v2 permission rule (docs/protocol.md) and the service's limits. */
import fs from 'node:fs';
import path from 'node:path';
import { fail, ok, type Result } from '../../common/result.js';
import type { VcpuSpec } from '../../model/vcpus.js';
import type { VmSpec } from '../../model/vm.js';
import { readStarttime } from '../../os/proc-starttime.js';
import { readProcFile } from '../../os/proc-file.js';
import { readQemuName } from '../../discovery/qemu-name.js';
import { tidBelongsTo } from '../../os/peer.js';
import type { PeerCredentials } from '../../os/libc/sockets.js';
import { statNumThreads } from '../../ratio/stat.js';
import type { FdAdmission, FdUsage } from '../../budget/fd-budget.js';
import { cannot } from '../../common/errors.js';
import type { V2Limits } from './v2-limits.js';

/** Whether a VM of so many threads still fits in the helper's file descriptors (VmFdShares, FdBudget). */
export interface FdAdmitter {
  /** `pid`: the VM's process, whose owner's share is checked too (budget/vm-fd-shares.ts). */
  canAdmit(threads: number, pid?: number): FdAdmission;
  /** For statistics files; absent = always. */
  canOpen?(n: number, what: string): FdAdmission;
  /** For the host statistics file; absent or null: not known. */
  usage?(): FdUsage | null;
}

/** What the registry reads of a process in /proc: null (undefined for the name) when it does not exist or cannot be read. */
export function procView(procRoot: string) {
  return {
    ownerUid(pid: number): number | null {
      try {
        return fs.statSync(path.join(procRoot, String(pid))).uid;
      } catch {
        return null;
      }
    },
    isThreadOf: (pid: number, tid: number) => tidBelongsTo(procRoot, pid, tid),
    starttime: (pid: number) => readStarttime(procRoot, pid),
    /** QEMU's -name, for traces and logs. */
    name: (pid: number) => readQemuName(procRoot, pid),
    threads(pid: number): number | null {
      try {
        const n = statNumThreads(readProcFile(path.join(procRoot, String(pid), 'stat')));
        return n > 0 ? n : null;
      } catch {
        return null;
      }
    },
  };
}

type ProcView = ReturnType<typeof procView>;

export type RefusalReason = 'limit' | 'not-permitted' | 'process-gone';

/** A REGISTER admitted (`attachTo`: a VM of the same process, discovered or restored, it takes over), or refused. */
type Admission = Result<{ spec: VmSpec; uid: number; attachTo?: number }, { reason: RefusalReason; message: string }>;

/** What LIST shows of a VM besides its energy. */
interface VmMeta {
  name: string | null;
  uuid: Buffer | null;
  wholeVmOnly: boolean;
}

export interface VmRecord extends VmMeta {
  vmId: number;
  /** Connection that registered it; null for a VM only discovered. */
  owner: number | null;
  pid: number;
  starttime: number;
  uid: number;
  live: boolean;
  /** Found by the /proc scan (alone, or besides a registration). */
  discovered: boolean;
  /** Samples since it ended (a discovered VM is dropped after a few, docs/protocol-v2.md). */
  endedSamples: number;
  /** Not every thread was sampled at the last sample (whole-vms.ts); not carried over a restart. */
  notWhole?: boolean;
}

/** For the visibility rule (docs/protocol-v2.md "Who may see what"). */
export interface Viewer {
  connId: number;
  uid: number;
  seesAll: boolean;
}

const sees = (v: Viewer, r: VmRecord): boolean => v.seesAll || r.uid === v.uid || r.owner === v.connId;

export class VmRegistry {
  private readonly vms = new Map<number, VmRecord>();
  private readonly byOwner = new Map<number, Set<number>>();
  /** pid -> vmId of its registration, live or ended: one per pid, so a trace's "unregister <pid>" names one VM. */
  private readonly byPid = new Map<number, number>();
  private readonly discoveredByPid = new Map<number, number>();
  /** Registrations carried over a restart waiting for a REGISTER of their process (docs/daemon.md "Restart state"). */
  private readonly awaiting = new Set<number>();

  constructor(
    readonly limits: V2Limits,
    private readonly proc: ProcView,
    private readonly fds?: FdAdmitter,
  ) {}

  /** Registered VMs (each counts against --max-vms), live or ended. */
  get size(): number {
    return this.byPid.size;
  }

  get total(): number {
    return this.vms.size;
  }

  /** Checks a REGISTER from connection `owner`; adds nothing. */
  admit(
    owner: number,
    peer: Pick<PeerCredentials, 'pid' | 'uid' | 'starttime'>,
    req: { pid: number; vcpus: readonly VcpuSpec[] },
  ): Admission {
    const no = (reason: RefusalReason, message: string): Admission => fail({ reason, message });
    if (req.vcpus.length > this.limits.maxVcpus)
      return no('limit', `${req.vcpus.length} vCPUs is over the limit of ${this.limits.maxVcpus}`);
    const mine = this.byOwner.get(owner)?.size ?? 0;
    if (mine >= this.limits.maxVmsPerConnection)
      return no('limit', `this connection already has ${mine} VMs registered (limit ${this.limits.maxVmsPerConnection})`);
    if (this.byPid.size >= this.limits.maxVms)
      return no('limit', `the helper already has ${this.byPid.size} VMs registered (limit ${this.limits.maxVms})`);

    const pid = req.pid === 0 ? peer.pid : req.pid;
    if (pid <= 0) return no('not-permitted', 'the peer pid is unknown');
    // starttime before and after the checks: a pid that exits and is reused in between is caught.
    const start = this.proc.starttime(pid);
    const owner_uid = this.proc.ownerUid(pid);
    if (start === null || owner_uid === null) return no('process-gone', `process ${pid} does not exist`);
    // The peer itself is the process that connected, not whatever holds its pid now: the connection can
    // outlive it, and its pid be reused by another user's process.
    const itself = pid === peer.pid && (peer.starttime === undefined || peer.starttime === start);
    if (!(itself || peer.uid === 0 || peer.uid === owner_uid)) {
      const gone = pid === peer.pid ? ' (the process that connected has exited; its pid now names another process)' : '';
      return no(
        'not-permitted',
        `process ${pid} belongs to uid ${owner_uid}${gone}; the peer (pid ${peer.pid}, uid ${peer.uid}) may register only its own processes`,
      );
    }
    for (const v of req.vcpus) {
      if (!this.proc.isThreadOf(pid, v.tid)) return no('not-permitted', `tid ${v.tid} is not a thread of process ${pid}`);
    }
    if (this.proc.starttime(pid) !== start) return no('process-gone', `process ${pid} exited during registration`);
    const other = this.byPid.get(pid);
    const waiting = other === undefined ? undefined : this.vms.get(other);
    const spec: VmSpec = { pid, starttime: start, vcpus: req.vcpus.map((v) => ({ tid: v.tid, vpkg: v.vpkg })) };
    // A registration a restart carried over, of this very process: the new connection takes it over.
    if (waiting !== undefined && this.awaiting.has(waiting.vmId) && waiting.live && waiting.starttime === start) {
      if (waiting.name !== null) spec.name = waiting.name;
      return ok({ spec, uid: owner_uid, attachTo: waiting.vmId });
    }
    if (other !== undefined) {
      const why = waiting?.live ? 'is already registered' : 'still has an ended registration (a reused pid)';
      return no('limit', `process ${pid} ${why} (vm_id ${other}); unregister it first`);
    }
    // REGISTER carries no name; QEMU's -name (libvirt's domain name) is what the host knows.
    const name = this.proc.name(pid);
    if (name !== undefined) spec.name = name;
    const found = this.discoveredByPid.get(pid);
    const d = found === undefined ? undefined : this.vms.get(found);
    // A discovered VM is sampled already: its fds are taken. Any other needs room for its threads.
    if (d !== undefined && d.live && d.starttime === start) return ok({ spec, uid: owner_uid, attachTo: d.vmId });
    if (this.fds) {
      const fit = this.fds.canAdmit(this.proc.threads(pid) ?? req.vcpus.length + 1, pid);
      if (!fit.ok) return no('limit', cannot(`register process ${pid}`, fit.error));
    }
    return ok({ spec, uid: owner_uid });
  }

  add(owner: number, vmId: number, spec: VmSpec, uid: number): VmRecord {
    let r = this.vms.get(vmId);
    if (r === undefined) {
      r = {
        vmId,
        owner,
        pid: spec.pid,
        starttime: spec.starttime,
        uid,
        live: true,
        discovered: false,
        endedSamples: 0,
        name: spec.name ?? null,
        uuid: null,
        wholeVmOnly: false,
      };
      this.vms.set(vmId, r);
    }
    if (r.owner !== null && r.owner !== owner) this.leaveOwner(r.owner, vmId);
    this.awaiting.delete(vmId);
    r.owner = owner;
    r.wholeVmOnly = false;
    this.joinOwner(owner, vmId);
    this.byPid.set(spec.pid, vmId);
    return r;
  }

  /** When `vmId` is a live registration of that process it is marked found too. */
  addDiscovered(vmId: number, pid: number, starttime: number, uid: number, meta: VmMeta): VmRecord {
    let r = this.vms.get(vmId);
    if (r === undefined) {
      r = { vmId, owner: null, pid, starttime, uid, live: true, discovered: true, endedSamples: 0, ...meta };
      this.vms.set(vmId, r);
    } else {
      r.discovered = true;
      r.name = meta.name;
      r.uuid = meta.uuid;
    }
    this.discoveredByPid.set(pid, vmId);
    return r;
  }

  registrationOf(pid: number, starttime: number): VmRecord | undefined {
    const id = this.byPid.get(pid);
    const r = id === undefined ? undefined : this.vms.get(id);
    return r && r.live && r.starttime === starttime ? r : undefined;
  }

  get(vmId: number): VmRecord | undefined {
    return this.vms.get(vmId);
  }

  canSee(v: Viewer, vmId: number): boolean {
    const r = this.vms.get(vmId);
    return r !== undefined && sees(v, r);
  }

  visible(v: Viewer, fromId: number): VmRecord[] {
    const out: VmRecord[] = [];
    for (const r of this.vms.values()) if (r.vmId >= fromId && sees(v, r)) out.push(r);
    return out.sort((a, b) => a.vmId - b.vmId);
  }

  all(): IterableIterator<VmRecord> {
    return this.vms.values();
  }

  /** The VM's process ended; its pid stays taken until the VM is unregistered. */
  markEnded(vmId: number): void {
    const e = this.vms.get(vmId);
    if (!e) return;
    e.live = false;
    if (this.discoveredByPid.get(e.pid) === vmId) this.discoveredByPid.delete(e.pid);
  }

  /** UNREGISTER or close; true when the VM stays (it goes on as discovered), false when it must be dropped. */
  release(vmId: number): boolean {
    const e = this.vms.get(vmId);
    if (!e || e.owner === null) return false;
    this.leaveOwner(e.owner, vmId);
    this.awaiting.delete(vmId);
    if (this.byPid.get(e.pid) === vmId) this.byPid.delete(e.pid);
    e.owner = null;
    return e.discovered && e.live;
  }

  remove(vmId: number): void {
    const e = this.vms.get(vmId);
    if (!e) return;
    if (e.owner !== null) this.release(vmId);
    if (this.discoveredByPid.get(e.pid) === vmId) this.discoveredByPid.delete(e.pid);
    this.vms.delete(vmId);
  }

  private joinOwner(owner: number, vmId: number): void {
    let set = this.byOwner.get(owner);
    if (!set) this.byOwner.set(owner, (set = new Set()));
    set.add(vmId);
  }

  private leaveOwner(owner: number, vmId: number): void {
    const set = this.byOwner.get(owner);
    set?.delete(vmId);
    if (set && set.size === 0) this.byOwner.delete(owner);
  }

  awaitingConnection(): number[] {
    return [...this.awaiting];
  }

  restore(records: readonly VmRecord[]): void {
    if (this.vms.size > 0) throw new Error('only an empty registry can be restored');
    for (const rec of records) {
      const r: VmRecord = { ...rec, uuid: rec.uuid && Buffer.from(rec.uuid) };
      this.vms.set(r.vmId, r);
      if (r.owner !== null) {
        this.joinOwner(r.owner, r.vmId);
        this.byPid.set(r.pid, r.vmId);
        this.awaiting.add(r.vmId);
      }
      if (r.discovered && r.live) this.discoveredByPid.set(r.pid, r.vmId);
    }
  }

  vmsOf(owner: number): number[] {
    return [...(this.byOwner.get(owner) ?? [])];
  }

  /** Plain copies: the indexes follow from the records, so this is the whole state. */
  state(): VmRecord[] {
    return [...this.vms.values()].map((r) => ({ ...r, uuid: r.uuid && Buffer.from(r.uuid) })).sort((a, b) => a.vmId - b.vmId);
  }
}
