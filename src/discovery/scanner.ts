/**
 * Finds QEMU/KVM processes in /proc (no QMP), cheaply enough for every interval: only new pids are read, one by one unless
 * more than MAX_PIDS_PROBED were handed out (/proc/loadavg) or on a full recheck, when /proc is listed. A known non-VM is
 * looked at again only while young (it may still exec QEMU: libvirt does) or on a full recheck. docs/discovery.md.
 */
import fs from 'node:fs';
import path from 'node:path';
import { cannot } from '../common/errors.js';
import { readProcFileOr } from '../os/proc-file.js';
import { shareOwnerOf } from '../budget/preferred-owner.js';
import { OTHERS_SHARE, UID_SHARE, UidShares, shareOf, type ShareBound, type ShareOwner } from '../budget/uid-share.js';
import { MAX_VCPUS, type VcpuSpec } from '../model/vcpus.js';
import { baseName, commOf, isQemuName, parseProcessStat, PF_KTHREAD, vcpuIndexOf, type ProcessStat } from './names.js';
import { parseQemuCommandLine, socketOf, type SmpTopology } from './qemu-cmdline.js';
import { readCmdline } from './qemu-name.js';
import { VpkgNumbering } from './vpkg-numbering.js';
import { DEFAULT_MAX_DISCOVERED_VMS } from './discovery-limits.js';

/** Pids handed out since the last scan looked up one by one (3 us gone, 10 present); more: /proc is listed (4 ms per 1,000 processes). */
export const MAX_PIDS_PROBED = 128;

export interface DiscoveredVm {
  pid: number;
  starttime: number;
  uid: number;
  name: string | null;
  uuid: Buffer | null;
  topology: SmpTopology;
  /** True when no thread is named `CPU <n>/KVM`: vpkg 0 gets the whole VM (its main thread stands for it). */
  wholeVmOnly: boolean;
  vcpus: VcpuSpec[];
  /** Threads of the process when found (what sampling it will hold open: one fd each). */
  threads: number;
  problems: string[];
}

export interface ScannerOptions {
  /** A non-VM process younger than this is looked at again every scan (it may still exec QEMU). */
  youngSeconds?: number;
  /** Every this many scans, every known non-VM pid is looked at again (a late exec). */
  fullRecheckEvery?: number;
  /** Thread names read from a multithreaded process not named like QEMU, looking for vCPU threads. */
  maxThreadsProbed?: number;
  /** VM processes tracked at once (default DEFAULT_MAX_DISCOVERED_VMS); a uid that is not a preferred owner at most its share (budget/uid-share.ts). */
  maxDiscoveredVms?: number;
  /** Groups whose processes are preferred owners besides root's (the daemon's --socket-group). */
  preferredGroups?: readonly number[];
  /** A VM process not tracked because the cap or its owner's share is full (rate-limit what it logs). */
  onFull?: (f: DiscoveryFull) => void;
  /** Seconds since boot (CLOCK_BOOTTIME); injected by tests. */
  uptime?: () => number;
  clkTck: number;
}

/** A VM process discovery did not track: the cap, or its owner's share, was full. */
interface DiscoveryFull {
  pid: number;
  uid: number;
  bound: ShareBound;
  tracked: number;
  message: string;
}

interface Other {
  starttime: number;
  comm: string;
  numThreads: number;
  young: boolean;
  /** A VM not admitted (fd budget, discovery cap or share): examined in full again at the next full recheck. */
  retry?: boolean;
  /** Carried over a restart (restore()): comm and numThreads are not known yet, only the starttime. */
  restored?: boolean;
}

/** A process discovery has looked at and found not to be a VM: (pid, starttime) names it. */
export interface KnownProcessState {
  pid: number;
  starttime: number;
}

interface Known {
  starttime: number;
  /** Who holds its discovery slot. */
  owner: ShareOwner;
  topology: SmpTopology;
  /** tid -> comm and guest socket as last classified, from `line` (the sample's stat line; '' when from comm). */
  threads: Map<number, { comm: string; socket: number | null; line: string }>;
  wholeVmOnly: boolean;
  /** Guest sockets holding vCPU threads -> virtual packages (only those: vpkg-numbering.ts). */
  numbering: VpkgNumbering;
}

export class ProcScanner {
  private readonly others = new Map<number, Other>();
  private readonly vms = new Map<number, Known>();
  /** The discovery slots each uid holds (one per tracked VM). */
  private readonly slots: UidShares;
  private scans = 0;
  private readonly youngS: number;
  private readonly fullEvery: number;
  private readonly maxProbe: number;
  readonly maxVms: number;
  private readonly uptime: () => number;
  /** What the scans cost (tests and the bench). */
  readonly cost = { statReads: 0, cmdlineReads: 0, threadProbes: 0, quietScans: 0, probeScans: 0, listings: 0 };
  private lastPid: number | null = null;

  constructor(
    private readonly procRoot: string,
    private readonly o: ScannerOptions,
  ) {
    this.youngS = o.youngSeconds ?? 10;
    this.fullEvery = Math.max(1, o.fullRecheckEvery ?? 60);
    this.maxProbe = o.maxThreadsProbed ?? 16;
    this.maxVms = o.maxDiscoveredVms ?? DEFAULT_MAX_DISCOVERED_VMS;
    this.slots = new UidShares(this.maxVms);
    this.uptime = o.uptime ?? (() => readUptime(procRoot));
  }

  get trackedVms(): number {
    return this.vms.size;
  }

  /** VM processes that appeared since the last scan, all at once (scanSteps() in slices). */
  scan(): DiscoveredVm[] {
    const found: DiscoveredVm[] = [];
    for (const vm of this.scanSteps()) if (vm !== null) found.push(vm);
    return found;
  }

  /** The same scan one pid (or the /proc listing) per step, yielding the VM found or null: in slices (sampling/time-slices.ts). */
  *scanSteps(): Generator<DiscoveredVm | null, void, undefined> {
    this.scans++;
    const full = this.scans % this.fullEvery === 0;
    const now = this.uptime();
    // The last pid handed out is the same: nothing new can be in /proc, only the young are looked at again.
    const lastPid = readLastPid(this.procRoot);
    const prevPid = this.lastPid;
    const quiet = !full && lastPid !== null && lastPid === prevPid;
    this.lastPid = lastPid;
    // Pids are handed out in increasing order (wrapping at pid_max): a known pid in (prevPid, lastPid] may be a new process.
    const fresh = (pid: number): boolean => {
      if (prevPid === null || lastPid === null) return true;
      return prevPid <= lastPid ? pid > prevPid && pid <= lastPid : pid > prevPid || pid <= lastPid;
    };
    if (quiet) {
      this.cost.quietScans++;
      yield* this.youngSteps(now);
      return;
    }
    if (!full && prevPid !== null && lastPid !== null && lastPid > prevPid && lastPid - prevPid <= MAX_PIDS_PROBED) {
      // A few pids handed out (processes or threads): look each up instead of listing /proc.
      this.cost.probeScans++;
      yield* this.youngSteps(now);
      for (let pid = prevPid + 1; pid <= lastPid; pid++) {
        const other = this.others.get(pid);
        if (this.vms.has(pid) || other?.young) continue; // young ones were examined just above
        yield this.examine(pid, other, now);
      }
      return;
    }
    this.cost.listings++;
    let names: string[];
    try {
      names = fs.readdirSync(this.procRoot);
    } catch {
      return;
    }
    yield null; // listing /proc is a step of its own
    const present = new Set<number>();
    for (const n of names) {
      const c = n.charCodeAt(0);
      if (c < 48 || c > 57) continue;
      const pid = Number(n);
      if (!Number.isSafeInteger(pid) || pid <= 0) continue;
      present.add(pid);
      if (this.vms.has(pid)) continue;
      const other = this.others.get(pid);
      if (other !== undefined && !other.young && !full && !fresh(pid)) continue;
      yield this.examine(pid, other, now, full);
    }
    for (const pid of this.others.keys()) if (!present.has(pid)) this.others.delete(pid);
  }

  /** The young processes (which may still exec QEMU) looked at again, one step each. */
  private *youngSteps(now: number): Generator<DiscoveredVm | null, void, undefined> {
    for (const [pid, other] of [...this.others]) {
      if (!other.young) continue;
      yield this.examine(pid, other, now);
    }
  }

  /** The processes found not to be VMs, as plain data (not a deferred VM, nor the tracked ones: a restart adopt()s those). */
  state(): KnownProcessState[] {
    const out: KnownProcessState[] = [];
    for (const [pid, o] of this.others) if (o.retry !== true) out.push({ pid, starttime: o.starttime });
    return out;
  }

  /** Takes back what state() gave, before the first scan: a process with the same starttime is known again. */
  restore(known: readonly KnownProcessState[]): void {
    for (const k of known) {
      if (!this.vms.has(k.pid)) this.others.set(k.pid, { starttime: k.starttime, comm: '', numThreads: -1, young: false, restored: true });
    }
  }

  /** A discovered VM a restart hands back, tracked again as scan() would; false when the pid no longer names that VM process. */
  adopt(pid: number, starttime: number): boolean {
    const st = this.readStat(pid);
    if (st === null || st.starttime !== starttime) return false;
    if (this.vms.has(pid)) return true;
    this.others.delete(pid);
    return this.examine(pid, undefined, this.uptime()) !== null;
  }

  /** The VM with this pid ended (or was dropped): its pid is examined afresh at the next scan. */
  forget(pid: number): void {
    this.untrack(pid);
    this.others.delete(pid);
  }

  private untrack(pid: number): Known | undefined {
    const k = this.vms.get(pid);
    if (k === undefined) return undefined;
    this.vms.delete(pid);
    this.slots.give(k.owner, 1);
    return k;
  }

  /** A VM found by scan() that the caller could not admit (no fds left): examined again at the next full recheck. */
  defer(pid: number): void {
    const k = this.untrack(pid);
    if (k === undefined) return;
    this.others.set(pid, { starttime: k.starttime, comm: '', numThreads: -1, young: false, retry: true });
  }

  /** The vCPU list of a tracked VM as last classified, null when the pid is not a tracked VM. */
  current(pid: number): { vcpus: VcpuSpec[]; wholeVmOnly: boolean } | null {
    const k = this.vms.get(pid);
    return k === undefined ? null : vcpusFrom(pid, k);
  }

  /** A VM's vCPU list anew from this sample's stat lines (comm in each) when threads were born, renamed or gone; else null. */
  refine(pid: number, lines: ReadonlyMap<number, string>): { vcpus: VcpuSpec[]; wholeVmOnly: boolean } | null {
    const k = this.vms.get(pid);
    if (k === undefined) return null;
    let changed = false;
    for (const [tid, line] of lines) {
      const prev = k.threads.get(tid);
      if (prev !== undefined && prev.line === line) continue; // the same line: the same comm
      const comm = commOf(line);
      if (comm === null) continue;
      if (prev !== undefined && prev.comm === comm) {
        prev.line = line;
        continue;
      }
      const idx = vcpuIndexOf(comm);
      const socket = idx === null ? null : socketOf(k.topology, idx);
      k.threads.set(tid, { comm, socket, line });
      if (prev === undefined && socket === null) continue;
      changed = true;
    }
    for (const tid of k.threads.keys()) {
      if (!lines.has(tid)) {
        if (k.threads.get(tid)!.socket !== null) changed = true;
        k.threads.delete(tid);
      }
    }
    if (!changed) return null;
    const r = vcpusFrom(pid, k);
    k.wholeVmOnly = r.wholeVmOnly;
    return r;
  }

  /** On a full recheck a QEMU-named process with threads is read in depth again: a `CPU <n>/KVM` rename shows in no stat field. */
  private examine(pid: number, before: Other | undefined, now: number, full = false): DiscoveredVm | null {
    const st = this.readStat(pid);
    if (st === null || st.exitSignal === -1) {
      // Gone, or a thread looked up by its tid (not a process).
      this.others.delete(pid);
      return null;
    }
    // Carried over a restart and still the same process (not young, so not about to exec QEMU): known.
    if (before?.restored === true && before.starttime === st.starttime && !this.isYoung(st, now)) {
      this.others.set(pid, otherOf(st, false));
      return null;
    }
    // Same process, nothing that could have changed what it is: skip the deeper reads.
    if (
      before !== undefined &&
      !before.retry &&
      before.starttime === st.starttime &&
      before.comm === st.comm &&
      before.numThreads === st.numThreads &&
      !(full && st.numThreads > 1 && isQemuName(st.comm))
    ) {
      before.young = this.isYoung(st, now);
      return null;
    }
    const notVm = (): null => {
      this.others.set(pid, otherOf(st, this.isYoung(st, now)));
      return null;
    };
    if ((st.flags & PF_KTHREAD) !== 0) return notVm();
    const named = isQemuName(st.comm);
    if (!named && st.numThreads <= 1) return notVm();
    // Thread names: every thread of a QEMU-named process; a bounded probe of anything else.
    const threads = this.readThreads(pid, named ? Infinity : this.maxProbe);
    const hasVcpu = [...threads.values()].some((c) => vcpuIndexOf(c) !== null);
    if (!named && !hasVcpu) return notVm();
    this.cost.cmdlineReads++;
    const args = readCmdline(this.procRoot, pid);
    if (args === null || args.length === 0) return notVm();
    if (!hasVcpu) {
      // Named like QEMU but no vCPU thread names: trust the executable when it can be read.
      const exe = this.readExe(pid);
      const argvQemu = isQemuName(baseName(args[0]!));
      if (exe !== null ? !isQemuName(baseName(exe).replace(/ \(deleted\)$/, '')) : !(argvQemu || named)) return notVm();
    }
    const owner = shareOwnerOf(this.procRoot, pid, this.o.preferredGroups ?? []);
    if (owner === null) return notVm();
    const slot = this.slots.room(owner);
    if (slot.room < 1) {
      this.o.onFull?.(this.full(pid, owner, slot.bound));
      // Examined in full again at the next full recheck: a slot may be free by then.
      this.others.set(pid, { ...otherOf(st, false), retry: true });
      return null;
    }
    this.slots.take(owner, 1);
    const cmd = parseQemuCommandLine(args);
    const known: Known = {
      starttime: st.starttime,
      owner,
      topology: cmd.topology,
      threads: new Map(),
      wholeVmOnly: true,
      numbering: new VpkgNumbering(),
    };
    for (const [tid, comm] of threads) {
      const idx = vcpuIndexOf(comm);
      known.threads.set(tid, { comm, socket: idx === null ? null : socketOf(cmd.topology, idx), line: '' });
    }
    const v = vcpusFrom(pid, known);
    known.wholeVmOnly = v.wholeVmOnly;
    this.vms.set(pid, known);
    this.others.delete(pid);
    return {
      pid,
      starttime: st.starttime,
      uid: owner.uid,
      name: cmd.name,
      uuid: cmd.uuid,
      topology: cmd.topology,
      wholeVmOnly: v.wholeVmOnly,
      vcpus: v.vcpus,
      threads: Math.max(st.numThreads, threads.size),
      problems: cmd.problems,
    };
  }

  private full(pid: number, owner: ShareOwner, bound: ShareBound): DiscoveryFull {
    const why =
      bound === 'capacity'
        ? `discovery tracks ${this.vms.size} VMs, its cap`
        : bound === 'uid'
          ? `uid ${owner.uid} has ${this.slots.heldBy(owner.uid)} VMs tracked, the ${shareOf(this.maxVms, UID_SHARE)} one uid may have ` +
            '(processes of root and --socket-group are not bound by it)'
          : `uids other than root and --socket-group have ${this.slots.others} VMs tracked, the ${shareOf(this.maxVms, OTHERS_SHARE)} they may have together`;
    const fix = `raise --max-discovered-vms${bound === 'capacity' ? '' : ' to grow every share'}`;
    return { pid, uid: owner.uid, bound, tracked: this.vms.size, message: cannot(`track VM process ${pid}`, why, fix) };
  }

  private isYoung(st: ProcessStat, now: number): boolean {
    return now - st.starttime / this.o.clkTck < this.youngS;
  }

  /** The pid's stat, null when there is no such pid (or it cannot be read); statReads counts the reads that worked. */
  private readStat(pid: number): ProcessStat | null {
    const line = readProcFileOr(path.join(this.procRoot, String(pid), 'stat'));
    if (line === null) return null;
    this.cost.statReads++;
    return parseProcessStat(line);
  }

  private readExe(pid: number): string | null {
    try {
      return fs.readlinkSync(path.join(this.procRoot, String(pid), 'exe'));
    } catch {
      return null; // another user's process without CAP_SYS_PTRACE: unknown
    }
  }

  /** tid -> comm of up to `max` threads (ascending tid). */
  private readThreads(pid: number, max: number): Map<number, string> {
    const out = new Map<number, string>();
    let tids: number[];
    try {
      tids = fs
        .readdirSync(path.join(this.procRoot, String(pid), 'task'))
        .filter((n) => /^\d{1,10}$/.test(n))
        .map(Number)
        .sort((a, b) => a - b);
    } catch {
      return out;
    }
    for (const tid of tids) {
      if (out.size >= max) break;
      this.cost.threadProbes++;
      const comm = readProcFileOr(path.join(this.procRoot, String(pid), 'task', String(tid), 'comm'));
      if (comm !== null) out.set(tid, comm.endsWith('\n') ? comm.slice(0, -1) : comm); // null: exited meanwhile
    }
    return out;
  }
}

/**
 * vCPU list from classified threads (none: the main thread stands for the VM in vpkg 0), at most MAX_VCPUS (the lowest tids:
 * thread names are the process's choice). A vCPU's vpkg numbers its guest socket among those holding vCPU threads.
 */
function vcpusFrom(pid: number, k: Pick<Known, 'threads' | 'numbering'>): { vcpus: VcpuSpec[]; wholeVmOnly: boolean } {
  const found: { tid: number; socket: number }[] = [];
  for (const [tid, t] of k.threads) if (t.socket !== null) found.push({ tid, socket: t.socket });
  if (found.length === 0) return { vcpus: [{ tid: pid, vpkg: 0 }], wholeVmOnly: true };
  found.sort((a, b) => a.tid - b.tid);
  if (found.length > MAX_VCPUS) found.length = MAX_VCPUS;
  const vpkgOfSocket = k.numbering.number(found.map((f) => f.socket));
  return { vcpus: found.map((f) => ({ tid: f.tid, vpkg: vpkgOfSocket.get(f.socket)! })), wholeVmOnly: false };
}

function otherOf(st: ProcessStat, young: boolean): Other {
  return { starttime: st.starttime, comm: st.comm, numThreads: st.numThreads, young };
}

/** Field 5 of /proc/loadavg ("running/total lastpid"): the last pid handed out, or null. */
function readLastPid(procRoot: string): number | null {
  const v = Number(readProcFileOr(path.join(procRoot, 'loadavg'))?.trim().split(' ')[4]);
  return Number.isSafeInteger(v) && v > 0 ? v : null;
}

function readUptime(procRoot: string): number {
  const text = readProcFileOr(path.join(procRoot, 'uptime'));
  return text === null ? Infinity : Number(text.split(' ')[0]); // unknown: nothing counts as young
}
