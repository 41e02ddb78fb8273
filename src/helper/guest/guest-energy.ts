/**
 * `--guest-energy exact` (docs/guest-energy.md). A VM switches only at a window's start: mid-window
 * would give QEMU one garbage delta.
 */
import { exeVersionText } from '../../os/exe-version.js';
import { processCpuTimeNs } from '../../os/libc/processes.js';
import type { PeerCredentials } from '../../os/libc/sockets.js';
import type { Logger } from '../../logging/logger.js';
import type { HostInfo } from '../../model/host.js';
import type { KeptFdLedger } from '../../os/proc-tasks.js';
import type { ShareOwner } from '../../budget/uid-share.js';
import {
  answerForecast,
  closeWindow,
  requestStep,
  counterStep,
  freshGuestCounter,
  freshPhases,
  settleWindow,
  type Exact,
  type GuestCounterState,
  type GuestVm,
  type PeerPhase,
  type ThreadSnapshot,
  type VcpuForecast,
} from '../../guest-energy/guest-counter.js';
import { ThreadReads, type HeldFds, type StartRead } from './thread-reads.js';
import { TaskCount } from './task-count.js';
import {
  ExitWatch,
  exitProbeKind,
  idleAtList,
  realExitOs,
  unseenCpuNs,
  type ExitOs,
  type ExitProbeKind,
  type WatchStart,
} from './thread-exits.js';
import { LogLimiter } from '../../logging/log-limiter.js';
import { GuestPeers, type ProcessKey } from './guest-peers.js';
import { readStarttime } from '../../os/proc-starttime.js';
import type { EnergyStatusHook } from '../legacy/legacy-service.js';

export interface GuestVmView extends GuestVm {
  vmId: number;
  starttime: number;
  /** Attributed energy now (J), in all and per virtual package (for the debug window line). */
  exactJ: number;
  vpkgJ?: readonly number[];
}

export interface GuestEnergyOptions {
  procRoot: string;
  host: HostInfo;
  /** Joules per unit of the guest's MSR_PKG_ENERGY_STATUS. */
  unitJ: number;
  find(pid: number): GuestVmView | undefined;
  /** find() for each of `pids` at once (after each sample: sampled()); default: none kept, find() at each window's end. */
  findAll?(pids: ReadonlySet<number>): ReadonlyMap<number, GuestVmView>;
  log: Logger;
  clock: () => bigint;
  maxThreads: number;
  /** The stat fds the sampler keeps open (ProcTaskReader.heldFds); default: none, every stat opened by path. */
  heldFds?: HeldFds;
  /** QEMU's version of a process ("10.0.2"), or null; default: read from its executable. */
  versionOf?: (pid: number) => Promise<string | null>;
  /** The VMs' fd shares, for the pidfds that tell thread exits (thread-exits.ts); default: not counted. */
  ledger?: KeptFdLedger;
  exitProbe?: ExitProbeKind;
  /** Who holds a peer's place, for the share rule (the connection's credentials when it asks; by pid at a restore); default: its uid, preferred. */
  owner?: (pid: number, peer?: PeerCredentials) => ShareOwner | null;
  maxPeers?: number;
}

/** `kvm_msr_energy_thread` arrived in 9.1 and its arithmetic is the same to 11.0 (docs/guest-energy.md "Versions"). */
const MODELLED_QEMU: readonly string[] = ['9.1', '9.2', '10.0', '10.1', '10.2', '11.0'];

/** QEMU's version ("10.0.2") from its executable's `--version` text ("QEMU emulator version 10.0.2 (Debian ...)"), or null. */
async function qemuVersion(procRoot: string, pid: number): Promise<string | null> {
  const text = await exeVersionText(procRoot, pid, 'QEMU emulator version ');
  const m = text === null ? null : /^(\d{1,3})\.(\d{1,3})(?:\.(\d{1,3}))?/.exec(text);
  return m ? `${Number(m[1])}.${Number(m[2])}.${Number(m[3] ?? 0)}` : null;
}

/** A window's start this soon after the last settling, same threads, takes its read (QEMU's end and start reads are < 1 ms apart). */
const SETTLED_START_NS = 20_000_000n;

/** A task directory held this long after its window began is let go (its QEMU stopped asking mid-window). */
const HOLD_LIMIT_NS = 10_000_000_000n;

/** Where an exact VM's window is: starting (vCPUs read, the others after the reply), open, settling (end forecast, read after the reply), closed. */
type Edge =
  | { at: 'starting'; vcpuTids: number[]; early: StartRead }
  | { at: 'open'; vcpuTids: number[]; runTimes?: StartRead['runTimes']; othersNs: number | undefined }
  | { at: 'settling'; runTimes?: StartRead['runTimes']; closing: GuestVm }
  | { at: 'closed' };

interface ExactIo {
  edge: Edge;
  /** The last window's end read (or the read when exact began), for the next start's ExitWatch and startFromSettled. */
  last?: { read: StartRead; atNs: bigint; othersNs?: number; mainNs?: number | null; settledNs?: bigint };
  nextVcpuTids?: number[];
  /** The task directory, held from the start read to the end: the forecast's check that no thread came or went. */
  taskCount?: TaskCount;
  closedVpkgJ?: readonly number[];
  exits?: ExitWatch;
  exitWindows: number;
  exitCauses?: Record<string, number>;
  lateExits: number;
}

type ExactVm = Exact<ExactIo>;

interface Peer extends PeerPhase<ExactIo> {
  key: ProcessKey;
  version: 'unknown' | 'reading' | 'modelled' | 'not modelled';
}

export class GuestEnergy implements EnergyStatusHook {
  private readonly peers: GuestPeers<Peer>;
  private readonly pkgOfCpu: Map<number, number>;
  private readonly maxTicks: Map<number, number>;
  private readonly reads: ThreadReads;
  /** The VMs whose window is starting or settling: read once the replies have left (drain). */
  private pending: ExactVm[] = [];
  private readonly nsPerTick: number;
  private views: ReadonlyMap<number, GuestVmView> = new Map();
  private readonly exitKind: ExitProbeKind;
  private readonly exitOs: ExitOs;
  private readonly limiter: LogLimiter;
  private boundLogged = false;

  constructor(private readonly o: GuestEnergyOptions) {
    this.pkgOfCpu = new Map(o.host.cpus.map((c) => [c.cpu, c.pkg]));
    this.maxTicks = new Map();
    for (const c of o.host.cpus) this.maxTicks.set(c.pkg, (this.maxTicks.get(c.pkg) ?? 0) + o.host.clkTck);
    this.reads = new ThreadReads(o.procRoot, this.pkgOfCpu, o.maxThreads, o.heldFds);
    this.nsPerTick = 1e9 / o.host.clkTck;
    this.exitKind = o.exitProbe ?? exitProbeKind();
    this.exitOs = realExitOs(o.procRoot);
    this.limiter = new LogLimiter(o.log);
    this.peers = new GuestPeers<Peer>({
      log: o.log,
      alive: (k) => readStarttime(o.procRoot, k.pid) === k.starttime,
      droppable: (p) => p.phase.at === 'listening',
      forgotten: (p) => p.phase.at === 'exact' && this.release(p.phase, true),
      capacity: o.maxPeers,
    });
  }

  /** The value to answer an MSR_PKG_ENERGY_STATUS request with, or undefined: answer it raw. */
  answer(from: PeerCredentials, cpu: number): bigint | undefined {
    this.afterReplies();
    const pkg = this.pkgOfCpu.get(cpu);
    if (pkg === undefined) return undefined;
    const now = this.o.clock();
    const peer = this.remember(from.pid, from.starttime, now, from);
    if (peer === undefined) return undefined;
    const step = requestStep(peer, pkg, now);
    if (step === 'zero') return 0n;
    if (peer.phase.at === 'exact') return BigInt(this.exactStep(peer.phase, pkg, now));
    if (step !== 'begin') return undefined;
    const x = this.begin(from.pid, peer);
    return x === undefined ? undefined : BigInt(this.afterStart(x, 0));
  }

  /** After a chunk's replies left: the forecast windows settled on the threads read now (as QEMU reads them), then the others of the windows begun (idle mostly, off the request's latency). */
  afterReplies(): void {
    this.settleAll();
    const now = this.pending.length > 0 ? this.o.clock() : 0n;
    for (const x of this.pending.splice(0)) if (x.edge.at === 'starting') this.readStart(x, x.edge, now);
  }

  private settleAll(): void {
    for (const x of this.pending) if (x.edge.at === 'settling') this.settle(x, x.edge);
    this.pending = this.pending.filter((x) => x.edge.at === 'starting');
  }

  /** A sample was taken: the exact VMs are looked up now, in one walk, off the window ends' request path. */
  sampled(): void {
    if (this.o.findAll === undefined) return;
    this.peers.sweep(this.o.clock());
    const pids = new Set([...this.exact()].map((x) => x.counter.pid));
    this.views = pids.size > 0 ? this.o.findAll(pids) : new Map();
  }

  /** What an operator sees of a VM's guest energy (stats, LIST, the exporter); undefined for a VM not in exact mode. */
  view(vmId: number) {
    this.settleAll();
    const x = [...this.exact()].find((e) => e.counter.vmId === vmId);
    if (x === undefined) return undefined;
    const c = x.counter;
    return {
      mode: 'exact' as const,
      // What QEMU was given to credit the guest since exact began, and what was attributed meanwhile.
      guestJ: c.creditedUnits * this.o.unitJ,
      exactJ: (c.creditedUnits + c.owedUnits - (c.excessUnits ?? 0)) * this.o.unitJ,
      windows: c.windows,
      garbageWindows: c.garbageWindows ?? 0,
      garbageJ: (c.garbageUnits ?? 0) * this.o.unitJ,
      exitWindows: x.exitWindows,
      lateExits: x.lateExits,
    };
  }

  state(): GuestCounterState[] {
    this.settleAll();
    return [...this.exact()].map((x) => x.counter);
  }

  /** Counters a previous process saved; `held`: the peers answered 0 before this was set up, resynchronised first. */
  restore(saved: readonly GuestCounterState[], held: ReadonlyMap<number, bigint> = new Map()): void {
    const now = this.o.clock();
    let kept = 0;
    for (const c of saved) {
      if (readStarttime(this.o.procRoot, c.pid) !== c.starttime) continue;
      const made = (key: ProcessKey): Peer => ({ key, version: 'modelled', phase: this.exactVm(c) });
      if (this.remember(c.pid, c.starttime, now, undefined, made) !== undefined) kept++;
    }
    for (const [pid, at] of held) {
      const peer = this.remember(pid, undefined, now);
      if (peer !== undefined) peer.resyncNs = at;
    }
    if (saved.length + held.size > 0)
      this.o.log.info({ vms: kept, ended: saved.length - kept, held: held.size }, 'guest energy: counters restored');
  }

  private *exact(): IterableIterator<ExactVm> {
    for (const p of this.peers.values()) if (p.phase.at === 'exact') yield p.phase;
  }

  private exactVm(counter: GuestCounterState): ExactVm {
    return { at: 'exact', counter, edge: { at: 'closed' }, exitWindows: 0, lateExits: 0 };
  }

  /** Remembered if there is room for its owner (docs/security.md); undefined: left raw. */
  private remember(
    pid: number,
    starttime: number | null | undefined,
    now: bigint,
    conn?: PeerCredentials,
    made = (key: ProcessKey): Peer => ({ key, version: 'unknown', phase: { at: 'listening', phases: freshPhases(), windowsSeen: 0 } }),
  ): Peer | undefined {
    const st = starttime === undefined ? readStarttime(this.o.procRoot, pid) : starttime;
    if (st === null) return undefined;
    const key = { pid, starttime: st };
    const owner = () => (this.o.owner === undefined ? { uid: conn?.uid ?? 0, preferred: true } : this.o.owner(pid, conn));
    return this.peers.get(key, owner, now, () => made(key));
  }

  private begin(pid: number, peer: Peer): ExactVm | undefined {
    const vm = this.o.find(pid);
    if (vm === undefined || vm.starttime !== peer.key.starttime || peer.phase.at !== 'listening') return undefined;
    if (peer.version === 'unknown') this.readVersion(pid, peer, vm);
    if (peer.version !== 'modelled') return undefined;
    const c = freshGuestCounter(vm.vmId, pid, vm.starttime, vm.nvpkg, vm.exactJ);
    const seen = peer.phase;
    c.phases = { ...seen.phases, pkgs: [...seen.phases.pkgs] };
    // The windows QEMU ran before: each counted its vCPUs into nb_vcpu (on the package they sit on now).
    const before = seen.windowsSeen - 1;
    const read = this.reads.readStart(pid);
    const x = (peer.phase = this.exactVm(c));
    // The threads as QEMU listed them, near enough: the first start read's ExitWatch is checked against them.
    if (read !== null) x.last = { read, atNs: this.o.clock() };
    for (const tid of vm.vcpus.keys()) {
      const pkg = read?.threads.get(tid)?.pkg ?? this.pkgOfCpu.values().next().value!;
      c.loop.nbVcpu.set(pkg, (c.loop.nbVcpu.get(pkg) ?? 0) + before);
    }
    this.o.log.info({ vm: vm.vmId, pid, windowsBefore: before }, 'guest energy: exact for this VM from this window on');
    return x;
  }

  private readVersion(pid: number, peer: Peer, vm: GuestVmView): void {
    peer.version = 'reading';
    const read = this.o.versionOf ?? ((p: number) => qemuVersion(this.o.procRoot, p));
    void read(pid).then(
      (v) => {
        peer.version = v !== null && MODELLED_QEMU.includes(v.split('.').slice(0, 2).join('.')) ? 'modelled' : 'not modelled';
        if (peer.version === 'not modelled')
          this.o.log.warn(
            { vm: vm.vmId, pid, qemu: v ?? 'unknown' },
            `guest energy: raw for this VM: QEMU ${v ?? '(version not found in its executable)'} is not a version whose vmsr loop the helper models (docs/guest-energy.md)`,
          );
      },
      () => (peer.version = 'not modelled'),
    );
  }

  private afterStart(x: ExactVm, value: number): number {
    const c = x.counter;
    c.start = null;
    const vcpuTids = x.nextVcpuTids ?? [...(this.o.find(c.pid)?.vcpus.keys() ?? [])];
    delete x.nextVcpuTids;
    x.edge = this.startFromSettled(x, c, vcpuTids) ?? { at: 'starting', vcpuTids, early: this.reads.readEarly(c.pid, vcpuTids) };
    if (x.edge.at === 'starting') this.pending.push(x);
    return value;
  }

  private readStart(x: ExactVm, w: Extract<Edge, { at: 'starting' }>, now: bigint): void {
    const c = x.counter;
    if (c.start !== null) return;
    this.release(x);
    // Counted before the list is read: a thread that comes or goes in between fails the end's check.
    const count = TaskCount.open(this.o.procRoot, c.pid);
    const mainNs = this.reads.mainRunNs(c.pid);
    const othersNs = this.othersNs(c.pid, w.vcpuTids) ?? undefined;
    const last = x.last;
    const same = last !== undefined && count !== null ? { read: last.read, count: count.first } : undefined;
    const read = this.reads.readStart(c.pid, w.early, same);
    const before = last !== undefined ? new Set(last.read.threads.keys()) : undefined;
    delete x.last;
    c.start = read?.threads ?? null;
    x.edge = { at: 'open', vcpuTids: w.vcpuTids, runTimes: read?.runTimes, othersNs };
    const cpuNs = unseenCpuNs(othersNs, last?.othersNs, mainNs, last?.mainNs);
    // Read after QEMU listed its threads: a thread at 0 ticks now was at 0 then.
    const idle = read !== null ? idleAtList(read, 0, this.nsPerTick) : undefined;
    if (c.start !== null) this.watch(x, { tids: c.start.keys(), before, gapNs: Number(this.o.clock() - (last?.atNs ?? 0n)), cpuNs, idle });
    if (count === null) return;
    // Its task directory held; those held past HOLD_LIMIT_NS let go (their QEMU stopped mid-window).
    for (const p of this.exact()) if (now - p.counter.phases.startNs > HOLD_LIMIT_NS) this.release(p, true);
    x.taskCount = count;
  }

  private exactStep(x: ExactVm, pkg: number, now: bigint): number {
    const c = x.counter;
    const step = counterStep(c, pkg, now);
    if (step.kind === 'start') return step.first ? this.afterStart(x, step.value) : step.value;
    if (!step.first) return step.value;
    const vm = this.views.get(c.pid) ?? this.o.find(c.pid);
    const exactJ = vm !== undefined && vm.starttime === c.starttime ? vm.exactJ : c.lastExactJ;
    const shape: GuestVm = vm ?? { pid: c.pid, vcpus: new Map(), nvpkg: c.loop.vpkgCounter.length };
    if (vm !== undefined) x.nextVcpuTids = [...vm.vcpus.keys()];
    x.closedVpkgJ = vm !== undefined && vm.starttime === c.starttime ? vm.vpkgJ : undefined;
    const w = x.edge;
    const runTimes = w.at === 'open' ? w.runTimes : undefined;
    const fc = w.at === 'open' ? this.forecast(x, w) : null;
    if (fc !== null) {
      // The reply leaves now; the threads are read and the window settled right after it (afterReplies).
      x.edge = { at: 'settling', closing: shape, runTimes };
      this.pending.push(x);
      const zero = this.exitBefore(x);
      return answerForecast(c, { pkg, ...fc, exactJ, unitJ: this.o.unitJ, maxTicks: this.maxTicks, zero });
    }
    const read = c.start !== null ? this.reads.readEnd(c.pid, { threads: c.start, runTimes: runTimes ?? new Map() }) : null;
    const end: ThreadSnapshot = read?.threads ?? this.reads.readStart(c.pid)?.threads ?? new Map();
    x.edge = { at: 'closed' };
    if (read !== null) x.last = { read, atNs: this.o.clock() };
    this.release(x);
    const zero = this.exitBefore(x);
    const value = closeWindow(c, shape, { pkg, end, exactJ, unitJ: this.o.unitJ, maxTicks: this.maxTicks, zero });
    if (c.bounded !== undefined && !this.boundLogged)
      this.o.log.warn(
        { vm: c.vmId, pid: c.pid },
        "guest energy: a window's e_delta search met its bound (its threads give no credit QEMU's u64 can reach); answered 0 and carried, said once",
      );
    this.boundLogged ||= c.bounded !== undefined;
    delete c.bounded;
    this.logWindow(x, c, false);
    return value;
  }

  /** The vCPUs' end ticks forecast from their run times; null (read before the reply): no start read, a thread came or went, a run time unreadable. */
  private forecast(x: ExactVm, w: Extract<Edge, { at: 'open' }>): { vcpus: VcpuForecast[]; otherTicks: number } | null {
    const c = x.counter;
    const othersNs = w.othersNs;
    if (c.start === null || othersNs === undefined || x.taskCount?.same() !== true) return null;
    const vcpus: VcpuForecast[] = [];
    let vcpuNs = 0;
    for (const tid of w.vcpuTids) {
      const ns = this.reads.runTimeNs(c.pid, tid);
      if (ns === null) return null;
      vcpuNs += ns;
      const a = c.start.get(tid);
      if (a !== undefined) vcpus.push({ pkg: a.pkg, ticks0: a.ticks, ticks1: Math.max(a.ticks, Math.floor(ns / this.nsPerTick)) });
    }
    const others = this.othersNs(c.pid, vcpuNs);
    if (others === null) return null;
    return { vcpus, otherTicks: Math.max(0, Math.ceil((others - othersNs) / this.nsPerTick)) };
  }

  /** The run time (ns) of `pid`'s threads but its vCPUs (their tids, or their run time); read so an end's less a start's errs high. */
  private othersNs(pid: number, vcpus: readonly number[] | number): number | null {
    const start = typeof vcpus !== 'number';
    const first = start ? processCpuTimeNs(pid) : 0n;
    let vcpuNs = start ? 0 : vcpus;
    for (const tid of start ? vcpus : []) {
      const ns = this.reads.runTimeNs(pid, tid);
      if (ns === null) return null;
      vcpuNs += ns;
    }
    const total = start ? first : processCpuTimeNs(pid);
    return total < 0n ? null : Number(total) - vcpuNs;
  }

  private settle(x: ExactVm, w: Extract<Edge, { at: 'settling' }>): void {
    const c = x.counter;
    x.edge = { at: 'closed' };
    if (c.answered === undefined) return;
    const read = c.start !== null ? this.reads.readEnd(c.pid, { threads: c.start, runTimes: w.runTimes ?? new Map() }) : null;
    const end: ThreadSnapshot = read?.threads ?? new Map();
    if (read !== null) x.last = { read, atNs: this.o.clock() };
    // The race left (docs/guest-energy.md, "Thread exits"): a listed thread gone now, after a non-zero delta left.
    if ([...c.answered.values()].some((e) => e > 0n) && x.exits?.exited() === true) x.lateExits++;
    this.keepForStart(x, c.pid, read);
    const garbage = c.garbageWindows ?? 0;
    settleWindow(c, w.closing, { end, maxTicks: this.maxTicks });
    if ((c.garbageWindows ?? 0) > garbage)
      this.limiter.warn(
        'guest garbage',
        { vm: c.vmId, pid: c.pid, garbageWindows: c.garbageWindows, garbageJ: (c.garbageUnits ?? 0) * this.o.unitJ, probe: x.exits?.probe },
        "guest energy: QEMU's arithmetic turned a window's delta into garbage (a thread exited after the reply): the guest's counter is off by garbageJ; docs/guest-energy.md \"Thread exits\"",
      );
    this.logWindow(x, c, true);
  }

  /** Whether a listed thread may have exited (no watch: yes): then the window is answered a zero delta, or QEMU's would underflow. */
  private exitBefore(x: ExactVm): boolean {
    const exit = x.exits?.exited() ?? true;
    if (exit) {
      x.exitWindows++;
      const cause = x.exits?.cause ?? 'no start read';
      (x.exitCauses ??= {})[cause] = (x.exitCauses[cause] ?? 0) + 1;
    }
    return exit;
  }

  private watch(x: ExactVm, w: WatchStart): void {
    (x.exits ??= new ExitWatch(x.counter.pid, this.exitKind, { os: this.exitOs, tickNs: this.nsPerTick, ledger: this.o.ledger })).begin(w);
  }

  private logWindow(x: ExactVm, c: GuestCounterState, forecast: boolean): void {
    if (!this.o.log.isLevelEnabled('debug')) return;
    this.o.log.debug(
      {
        vm: c.vmId,
        pid: c.pid,
        window: c.windows,
        credited: c.creditedUnits,
        exact: Math.round(c.creditedUnits + c.owedUnits - (c.excessUnits ?? 0)),
        guest: c.loop.vpkgCounter,
        forecast,
        exact_vpkg_uj: x.closedVpkgJ?.map((j) => Math.round(j * 1e6)),
        exit_windows: x.exitWindows,
        exit_causes: x.exitCauses,
        late_exits: x.lateExits,
        garbage_windows: c.garbageWindows ?? 0,
      },
      'guest window',
    );
  }

  private release(x: ExactVm, exits = false): void {
    x.taskCount?.close();
    delete x.taskCount;
    if (exits) x.exits?.close();
    if (exits) delete x.exits;
  }

  private keepForStart(x: ExactVm, pid: number, read: StartRead | null): void {
    const vcpus = x.nextVcpuTids;
    const othersNs = read === null || vcpus === undefined ? null : this.othersNs(pid, vcpus);
    if (othersNs === null || x.last === undefined) return this.release(x);
    // The main thread's run time read after the clock: what it ran since comes off what an unseen thread may have run (unseenCpuNs).
    [x.last.othersNs, x.last.mainNs] = [othersNs, this.reads.mainRunNs(pid)];
    if (x.taskCount !== undefined) x.last.settledNs = this.o.clock();
  }

  /** The last settling's read as the start's own (SETTLED_START_NS): one read at the boundary, so no tick is counted twice or lost. */
  private startFromSettled(x: ExactVm, c: GuestCounterState, vcpuTids: number[]): Edge | undefined {
    const s = x.last;
    const atNs = s?.settledNs;
    if (s !== undefined) delete s.settledNs;
    const count = x.taskCount;
    if (s === undefined || atNs === undefined || count === undefined || this.o.clock() - atNs > SETTLED_START_NS) return undefined;
    const now = count.now();
    if (now !== s.read.threads.size + 1) return undefined;
    count.first = now;
    c.start = s.read.threads;
    // Reads a tick apart (a loaded host): what the threads but the vCPUs ran meanwhile says whether one could have gone unseen.
    const gapNs = this.o.clock() - atNs;
    const mainNs = gapNs >= this.nsPerTick ? this.reads.mainRunNs(c.pid) : null;
    const others = gapNs >= this.nsPerTick ? this.othersNs(c.pid, vcpuTids) : null;
    const idle = idleAtList(s.read, Math.max(1, Number(gapNs)), this.nsPerTick);
    const cpuNs = unseenCpuNs(others ?? undefined, s.othersNs, mainNs, s.mainNs);
    this.watch(x, { tids: c.start.keys(), before: new Set(c.start.keys()), gapNs: Number(gapNs), cpuNs, idle });
    delete x.last;
    return { at: 'open', vcpuTids, runTimes: s.read.runTimes, othersNs: s.othersNs };
  }
}
