/**
 * `--guest-energy exact` (docs/guest-energy.md): QEMU's MSR_PKG_ENERGY_STATUS requests from a VM
 * the helper knows are answered from that VM's own guest counters (src/guest-energy/), so that
 * QEMU's unmodified vmsr loop credits the guest the energy the helper attributed to it. Everything
 * else (other registers, other peers, unknown VMs, a QEMU version not modelled, mode raw) is
 * answered raw by the legacy service.
 *
 * A VM switches to exact only at the start of one of QEMU's windows (a switch mid-window would give
 * QEMU one garbage delta), once its QEMU's version is known to be modelled; the windows QEMU ran
 * before it are counted, so the model's vCPU count (nb_vcpu) starts right.
 */
import { exeVersionText } from '../../os/exe-version.js';
import { processCpuTimeNs } from '../../os/libc/processes.js';
import { type PeerCredentials } from '../../os/libc/sockets.js';
import {
  closeWindow,
  counterStep,
  freshGuestCounter,
  settleWindow,
  type GuestCounterState,
  type GuestVm,
} from '../../guest-energy/guest-counter.js';
import { answerForecast, type VcpuForecast } from '../../guest-energy/forecast-window.js';
import { freshPhases, MIN_SLEEP_NS, nextPhase, type PhaseState } from '../../guest-energy/window-phases.js';
import { isModelled, parseQemuVersion, QEMU_VERSION_MARK } from '../../guest-energy/qemu-versions.js';
import type { ThreadSnapshot } from '../../guest-energy/thread-snapshot.js';
import { ThreadReads, type StartRead } from './thread-reads.js';
import { TaskCount } from './task-count.js';
import { ExitWatch, exitProbeKind, idleAtList, realExitOs, unseenCpuNs, type ExitOs, type ExitProbeKind } from './thread-exits.js';
import { LogLimiter } from '../../logging/log-limiter.js';
import { GuestPeers, type ProcessKey } from './guest-peers.js';
import { readStarttime } from '../../os/proc-starttime.js';
import type { EnergyStatusHook } from '../legacy/legacy-service.js';
import type { GuestEnergyOptions, GuestEnergyView, GuestVmView } from './guest-energy-options.js';

/**
 * A window's start this soon after the last window was settled, with the same threads, takes the
 * settling's read as its own (QEMU's own end and start reads are a fraction of a millisecond apart).
 */
const SETTLED_START_NS = 20_000_000n;

/** A task directory held this long after its window began is let go (its QEMU stopped asking mid-window). */
const HOLD_LIMIT_NS = 10_000_000_000n;

/** One peer asking for the counter: its windows seen, and its counters once exact. */
interface Peer {
  key: ProcessKey;
  phases: PhaseState;
  windowsSeen: number;
  version: 'unknown' | 'reading' | 'modelled' | 'not modelled';
  vmId?: number;
  counter?: GuestCounterState;
  /**
   * Answered 0 since a restart (its QEMU may be in a window whose one side was 0): 0 again until a
   * request comes soon after the last, which can only be a window's start; then as usual. The time of the last.
   */
  resyncNs?: bigint;
  /** The run time of each thread read just before its start line (ThreadReads.readStart), for the end read. */
  runTimes?: Map<number, string | null>;
  /** The last window's end read, for the next start's (ThreadReads.readStart). */
  lastRead?: StartRead;
  /**
   * The settling's read of the last window's end (its time, and the run time of the threads but the
   * next window's vCPUs then), for the next start to take as its own (startFromSettled).
   */
  settled?: { read: StartRead; atNs: bigint; othersNs: number; mainNs: number | null };
  /** A window's vCPU threads, read before its start reply (the rest are read after it). */
  early?: StartRead;
  /** The VM's vCPU threads at the window's start, for the end's forecast. */
  vcpuTids?: number[];
  /** The VM's vCPU threads as found at the last window's end, milliseconds before the next start: that start's. */
  nextVcpuTids?: number[];
  /** The task directory, held from the window's start read to its end: the forecast's check that no thread came or went. */
  taskCount?: TaskCount;
  /** At the window's start read: the run time (ns) of its threads but the vCPUs (othersNs), for the end's forecast. */
  othersNs?: number;
  /** The same at lastRead (the settling's read), for the next start's ExitWatch, and the main thread's run time read after it. */
  lastOthersNs?: number;
  lastMainNs?: number | null;
  /** The VM as found for the end answered from a forecast, until the window is settled. */
  closing?: GuestVm;
  /** The attributed energy per virtual package taken at the last window's end (J), for its debug line. */
  closedVpkgJ?: readonly number[];
  /** When lastRead (or the settling's read) was read, for the next start's ExitWatch. */
  lastReadNs?: bigint;
  /** The window's threads watched for an exit (thread-exits.ts), from its start read on. */
  exits?: ExitWatch;
  /** Windows answered a zero delta because a listed thread may have exited before the reply (and why, per cause: ExitWatch.cause). */
  exitWindows: number;
  exitCauses?: Record<string, number>;
  /** Windows answered a non-zero delta in which a listed thread was seen gone right after the reply (the race left). */
  lateExits: number;
}

export class GuestEnergy implements EnergyStatusHook {
  private readonly peers: GuestPeers<Peer>;
  private readonly pkgOfCpu: Map<number, number>;
  private readonly maxTicks: Map<number, number>;
  private readonly reads: ThreadReads;
  /** Windows begun whose start read waits for the reply to leave (afterReplies). */
  private readonly starting: Peer[] = [];
  /** Windows whose end was answered from a forecast, to settle once the reply has left (afterReplies). */
  private readonly settling: Peer[] = [];
  /** Peers holding a task directory (TaskCount). */
  private readonly holding = new Set<Peer>();
  /** Nanoseconds of run time a clock tick (utime and stime are counted in CLK_TCK). */
  private readonly nsPerTick: number;
  /** The exact VMs as the last sample left them (sampled()), for their windows' ends. */
  private views: ReadonlyMap<number, GuestVmView> = new Map();
  private readonly exitKind: ExitProbeKind;
  private readonly exitOs: ExitOs;
  /** Peers whose threads are watched (ExitWatch): let go with their task directory's hold. */
  private readonly watching = new Set<Peer>();
  private readonly limiter: LogLimiter;
  /** A delta search met its bound once already (logBounded). */
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
      droppable: (p) => p.counter === undefined,
      forgotten: (p) => this.release(p),
      ...(o.maxPeers !== undefined ? { capacity: o.maxPeers } : {}),
    });
  }

  /** The value to answer an MSR_PKG_ENERGY_STATUS request with, or undefined: answer it raw. */
  answer(from: PeerCredentials, cpu: number): bigint | undefined {
    if (this.starting.length + this.settling.length > 0) this.afterReplies();
    const pkg = this.pkgOfCpu.get(cpu);
    if (pkg === undefined) return undefined;
    const now = this.o.clock();
    const peer = this.peer(from, now);
    if (peer === undefined) return undefined;
    const peerPid = from.pid;
    if (peer.resyncNs !== undefined) {
      const last = peer.resyncNs;
      peer.resyncNs = now;
      if (now - last >= MIN_SLEEP_NS) return 0n;
      delete peer.resyncNs;
      peer.phases = freshPhases();
      if (peer.counter !== undefined) peer.counter.phases = freshPhases();
    }
    if (peer.counter !== undefined) return BigInt(this.exactStep(peer, peer.counter, pkg, now));
    const step = nextPhase(peer.phases, pkg, now);
    if (step.kind !== 'start' || !step.first) return undefined;
    peer.windowsSeen++;
    if (!this.begin(peerPid, peer)) return undefined;
    return BigInt(this.afterStart(peer, 0));
  }

  /**
   * After the replies of a chunk left: the start reads of the windows they began. QEMU read its
   * threads just before asking and the start value does not depend on them, so the threads that
   * move (the vCPUs) were read before the reply and the others (idle mostly: a later read sees the
   * same ticks) are read right after it, in the same turn of the event loop, off the request's
   * latency (the vCPUs read after it, even in the same turn, could be read after QEMU's vmsr thread
   * and whatever else ran once the reply woke it). And the windows whose end was answered from a
   * forecast are settled on the threads read now, as QEMU reads them once it has the reply. Also
   * run before the next request.
   */
  afterReplies(): void {
    for (const peer of this.settling.splice(0)) this.settle(peer);
    const now = this.starting.length > 0 ? this.o.clock() : 0n;
    for (const peer of this.starting.splice(0)) {
      const c = peer.counter;
      if (c === undefined || c.start !== null) continue;
      this.release(peer);
      // Counted before the list is read: a thread that comes or goes in between fails the end's check.
      const count = TaskCount.open(this.o.procRoot, c.pid);
      const mainNs = this.reads.mainRunNs(c.pid);
      peer.othersNs = this.othersNs(c.pid, 'start', () => this.runTimesNs(c.pid, peer.vcpuTids ?? [])) ?? undefined;
      const last = peer.lastRead !== undefined && count !== null ? { read: peer.lastRead, count: count.first } : undefined;
      const read = this.reads.readStart(c.pid, peer.early, last);
      const before = peer.lastRead !== undefined ? new Set(peer.lastRead.threads.keys()) : undefined;
      delete peer.early;
      delete peer.lastRead;
      c.start = read?.threads ?? null;
      const cpuNs = unseenCpuNs(peer.othersNs, peer.lastOthersNs, mainNs, peer.lastMainNs);
      // Read after QEMU listed its threads: a thread at 0 ticks now was at 0 then.
      const idle = read !== null ? idleAtList(read, 0, this.nsPerTick) : undefined;
      if (c.start !== null) this.watch(peer, c.start.keys(), before, this.o.clock() - (peer.lastReadNs ?? 0n), { cpuNs, idle });
      peer.runTimes = read?.runTimes;
      if (count !== null) this.hold(peer, count, now);
    }
  }

  /**
   * A sample was taken: the exact VMs are looked up now, in one walk, so that a window's end (until
   * the next sample) finds its VM as find() would then, without the lookup on the request's path.
   */
  sampled(): void {
    if (this.o.findAll === undefined) return;
    this.peers.sweep(this.o.clock());
    const pids = new Set<number>();
    for (const p of this.peers.values()) if (p.counter !== undefined) pids.add(p.counter.pid);
    this.views = pids.size > 0 ? this.o.findAll(pids) : new Map();
  }

  /** Per VM, what QEMU was given against what was attributed; undefined for a VM not in exact mode. */
  view(vmId: number): GuestEnergyView | undefined {
    for (const peer of this.settling.splice(0)) this.settle(peer);
    for (const p of this.peers.values()) {
      const c = p.counter;
      if (p.vmId !== vmId || c === undefined) continue;
      return {
        mode: 'exact',
        guestJ: c.creditedUnits * this.o.unitJ,
        exactJ: (c.creditedUnits + c.owedUnits - (c.excessUnits ?? 0)) * this.o.unitJ,
        windows: c.windows,
        garbageWindows: c.garbageWindows ?? 0,
        garbageJ: (c.garbageUnits ?? 0) * this.o.unitJ,
        exitWindows: p.exitWindows,
        lateExits: p.lateExits,
      };
    }
    return undefined;
  }

  /** Every exact-mode VM's counters, for the restart state. */
  state(): GuestCounterState[] {
    for (const peer of this.settling.splice(0)) this.settle(peer);
    const out: GuestCounterState[] = [];
    for (const p of this.peers.values()) if (p.counter !== undefined) out.push(p.counter);
    return out;
  }

  /**
   * Counters a previous process saved: their QEMUs go on with the same counters and model. `held`:
   * the peers answered 0 before this was set up (LegacyService's hold), resynchronised first.
   */
  restore(saved: readonly GuestCounterState[], held: ReadonlyMap<number, bigint> = new Map()): void {
    const now = this.o.clock();
    let kept = 0;
    for (const c of saved) {
      // A process that ended meanwhile is forgotten; one on its pid since is another process.
      const key = { pid: c.pid, starttime: c.starttime };
      if (readStarttime(this.o.procRoot, c.pid) !== c.starttime) continue;
      const made = () => ({
        key,
        phases: c.phases,
        windowsSeen: c.windows,
        version: 'modelled' as const,
        vmId: c.vmId,
        counter: c,
        exitWindows: 0,
        lateExits: 0,
      });
      if (this.remember(key, c.pid, now, made) !== undefined) kept++;
    }
    for (const [pid, at] of held) {
      const starttime = readStarttime(this.o.procRoot, pid);
      if (starttime === null) continue;
      const key = { pid, starttime };
      const peer = this.remember(key, pid, now, () => this.freshPeer(key));
      if (peer !== undefined) peer.resyncNs = at;
    }
    if (saved.length + held.size > 0)
      this.o.log.info({ vms: kept, ended: saved.length - kept, held: held.size }, 'guest energy: counters restored');
  }

  /** The peer of a connection's process, or undefined: left raw (its start time unknown, or no room for it). */
  private peer(from: PeerCredentials, now: bigint): Peer | undefined {
    const starttime = from.starttime === undefined ? readStarttime(this.o.procRoot, from.pid) : from.starttime;
    if (starttime === null) return undefined;
    const key = { pid: from.pid, starttime };
    return this.remember(key, from, now, () => this.freshPeer(key));
  }

  /** The peer of `key`, remembered if there is room for its owner (the connection `from`, or the process by its pid). */
  private remember(key: ProcessKey, from: PeerCredentials | number, now: bigint, make: () => Peer): Peer | undefined {
    const pid = typeof from === 'number' ? from : from.pid;
    const conn = typeof from === 'number' ? undefined : from;
    const owner = () => (this.o.owner === undefined ? { uid: conn?.uid ?? 0, preferred: true } : this.o.owner(pid, conn));
    return this.peers.get(key, owner, now, make);
  }

  private freshPeer(key: ProcessKey): Peer {
    return { key, phases: freshPhases(), windowsSeen: 0, version: 'unknown', exitWindows: 0, lateExits: 0 };
  }

  /** At a window's start: turns the peer's counters on when its VM is known and its QEMU modelled. */
  private begin(pid: number, peer: Peer): boolean {
    const vm = this.o.find(pid);
    if (vm === undefined || vm.starttime !== peer.key.starttime) return false;
    if (peer.version === 'unknown') this.readVersion(pid, peer, vm);
    if (peer.version !== 'modelled') return false;
    const c = freshGuestCounter(vm.vmId, pid, vm.starttime, vm.nvpkg, vm.exactJ);
    c.phases = { ...peer.phases, pkgs: [...peer.phases.pkgs] };
    // The windows QEMU ran before: each counted its vCPUs into nb_vcpu (on the package they sit on now).
    const before = peer.windowsSeen - 1;
    const read = this.reads.readStart(pid);
    const now = read?.threads;
    // The threads as QEMU listed them, near enough: the first start read's ExitWatch is checked against them.
    if (read !== null) [peer.lastRead, peer.lastReadNs] = [read, this.o.clock()];
    for (const tid of vm.vcpus.keys()) {
      const pkg = now?.get(tid)?.pkg ?? this.pkgOfCpu.values().next().value!;
      c.loop.nbVcpu.set(pkg, (c.loop.nbVcpu.get(pkg) ?? 0) + before);
    }
    peer.counter = c;
    peer.vmId = vm.vmId;
    this.o.log.info({ vm: vm.vmId, pid, windowsBefore: before }, 'guest energy: exact for this VM from this window on');
    return true;
  }

  private readVersion(pid: number, peer: Peer, vm: GuestVmView): void {
    peer.version = 'reading';
    const read =
      this.o.versionOf ??
      ((p: number) => exeVersionText(this.o.procRoot, p, QEMU_VERSION_MARK).then((t) => (t === null ? null : parseQemuVersion(t))));
    void read(pid).then(
      (v) => {
        peer.version = v !== null && isModelled(v) ? 'modelled' : 'not modelled';
        if (peer.version === 'not modelled')
          this.o.log.warn(
            { vm: vm.vmId, pid, qemu: v ?? 'unknown' },
            `guest energy: raw for this VM: QEMU ${v ?? '(version not found in its executable)'} is not a version whose vmsr loop the helper models (docs/guest-energy.md)`,
          );
      },
      () => (peer.version = 'not modelled'),
    );
  }

  private exactStep(peer: Peer, c: GuestCounterState, pkg: number, now: bigint): number {
    const step = counterStep(c, pkg, now);
    if (step.kind === 'start') return step.first ? this.afterStart(peer, step.value) : step.value;
    if (!step.first) return step.value;
    const vm = this.views.get(c.pid) ?? this.o.find(c.pid);
    const exactJ = vm !== undefined && vm.starttime === c.starttime ? vm.exactJ : c.lastExactJ;
    const shape: GuestVm = vm ?? { pid: c.pid, vcpus: new Map(), nvpkg: c.loop.vpkgCounter.length };
    if (vm !== undefined) peer.nextVcpuTids = [...vm.vcpus.keys()];
    peer.closedVpkgJ = vm !== undefined && vm.starttime === c.starttime ? vm.vpkgJ : undefined;
    const fc = this.forecast(peer, c);
    if (fc !== null) {
      // The reply leaves now; the threads are read and the window settled right after it (afterReplies).
      peer.closing = shape;
      this.settling.push(peer);
      const zero = this.exitBefore(peer);
      return answerForecast(c, { pkg, ...fc, exactJ, unitJ: this.o.unitJ, maxTicks: this.maxTicks, zero });
    }
    // No forecast (a thread came or went, no start read, no held fd): the threads are read before
    // the reply, and the e_delta solved on them. QEMU reads, at the end, the threads it listed at
    // the start; without a start read (a restart mid-window, a process gone), every thread, for the
    // model's count of vCPUs.
    const read = c.start !== null ? this.reads.readEnd(c.pid, { threads: c.start, runTimes: peer.runTimes ?? new Map() }) : null;
    const end: ThreadSnapshot = read?.threads ?? this.reads.readStart(c.pid)?.threads ?? new Map();
    delete peer.runTimes;
    if (read !== null) [peer.lastRead, peer.lastReadNs] = [read, this.o.clock()];
    delete peer.lastOthersNs;
    this.release(peer);
    const zero = this.exitBefore(peer);
    const value = closeWindow(c, shape, { pkg, end, exactJ, unitJ: this.o.unitJ, maxTicks: this.maxTicks, zero });
    if (c.bounded !== undefined) this.logBounded(peer, c);
    this.logWindow(peer, c, false);
    return value;
  }

  /**
   * The vCPUs' end ticks, forecast from their run times (one schedstat pread each, through the
   * sampler's fds), or null when the window must be read before the reply: no start read, a thread
   * came or went (the task directory's count moved; QEMU's tick delta of an exited thread
   * underflows unless answered a zero delta), or a vCPU's run time cannot be read.
   */
  private forecast(peer: Peer, c: GuestCounterState): { vcpus: VcpuForecast[]; otherTicks: number } | null {
    if (c.start === null || peer.vcpuTids === undefined || peer.othersNs === undefined || peer.taskCount?.same() !== true) return null;
    const vcpus: VcpuForecast[] = [];
    let vcpuNs = 0;
    for (const tid of peer.vcpuTids) {
      const ns = this.reads.runTimeNs(c.pid, tid);
      if (ns === null) return null;
      vcpuNs += ns;
      const a = c.start.get(tid);
      if (a !== undefined) vcpus.push({ pkg: a.pkg, ticks0: a.ticks, ticks1: Math.max(a.ticks, Math.floor(ns / this.nsPerTick)) });
    }
    const others = this.othersNs(c.pid, 'end', () => vcpuNs);
    if (others === null) return null;
    return { vcpus, otherTicks: Math.max(0, Math.ceil((others - peer.othersNs) / this.nsPerTick)) };
  }

  /**
   * The run time (ns) of `pid`'s threads but its vCPUs (`vcpuNs`: read after the clock at the
   * start, before it at the end): its process CPU clock less theirs; null when one cannot be read. It counts the main thread too, which QEMU
   * leaves out (the sampler holds no schedstat fd for it): the forecast errs low by its share. Read
   * so that an end's less a start's errs high: the clock first at the start, last at the end.
   */
  private othersNs(pid: number, edge: 'start' | 'end', vcpuNs: () => number | null): number | null {
    const first = edge === 'start' ? processCpuTimeNs(pid) : 0n;
    const vcpus = vcpuNs();
    if (vcpus === null) return null;
    const total = edge === 'end' ? processCpuTimeNs(pid) : first;
    return total < 0n ? null : Number(total) - vcpus;
  }

  /** The sum of the run times of `tids` (ns), or null when one cannot be read. */
  private runTimesNs(pid: number, tids: readonly number[]): number | null {
    let sum = 0;
    for (const tid of tids) {
      const ns = this.reads.runTimeNs(pid, tid);
      if (ns === null) return null;
      sum += ns;
    }
    return sum;
  }

  /** After a forecast's reply: the threads QEMU listed read as QEMU reads them now, and the window settled on them. */
  private settle(peer: Peer): void {
    const c = peer.counter;
    if (c === undefined || c.answered === undefined) return;
    const read = c.start !== null ? this.reads.readEnd(c.pid, { threads: c.start, runTimes: peer.runTimes ?? new Map() }) : null;
    const end: ThreadSnapshot = read?.threads ?? new Map();
    delete peer.runTimes;
    if (read !== null) [peer.lastRead, peer.lastReadNs] = [read, this.o.clock()];
    // The race left (docs/guest-energy.md, "Thread exits"): a listed thread gone now, after a non-zero delta left.
    let answered = 0n;
    for (const e of c.answered?.values() ?? []) answered += e;
    if (answered > 0n && peer.exits?.exited() === true) peer.lateExits++;
    this.keepForStart(peer, c.pid, read);
    const garbage = c.garbageWindows ?? 0;
    settleWindow(c, peer.closing ?? { pid: c.pid, vcpus: new Map(), nvpkg: c.loop.vpkgCounter.length }, { end, maxTicks: this.maxTicks });
    delete peer.closing;
    if ((c.garbageWindows ?? 0) > garbage) this.warnGarbage(peer, c);
    this.logWindow(peer, c, true);
  }

  /**
   * At a window's end, just before its reply: whether a thread QEMU listed at its start may have
   * exited (ExitWatch; no watch: no start read, already a zero delta). Such a window is answered a
   * zero delta: QEMU's tick delta of the exited thread would underflow.
   */
  private exitBefore(peer: Peer): boolean {
    const exit = peer.exits?.exited() ?? true;
    if (exit) {
      peer.exitWindows++;
      const cause = peer.exits?.cause ?? 'no start read';
      (peer.exitCauses ??= {})[cause] = (peer.exitCauses[cause] ?? 0) + 1;
    }
    return exit;
  }

  /** A window's start read: its threads watched for an exit from now on (`before`: the helper's read before it, `gapNs` apart). */
  private watch(
    peer: Peer,
    tids: Iterable<number>,
    before: ReadonlySet<number> | undefined,
    gapNs: bigint,
    o: { cpuNs: number | undefined; idle: ReadonlySet<number> | undefined },
  ): void {
    const c = peer.counter!;
    peer.exits ??= new ExitWatch(c.pid, this.exitKind, {
      os: this.exitOs,
      tickNs: this.nsPerTick,
      ...(this.o.ledger !== undefined ? { ledger: this.o.ledger } : {}),
    });
    peer.exits.begin({
      tids,
      ...(before !== undefined ? { before } : {}),
      gapNs: Number(gapNs),
      ...(o.cpuNs !== undefined ? { cpuNs: o.cpuNs } : {}),
      ...(o.idle !== undefined ? { idle: o.idle } : {}),
    });
    this.watching.add(peer);
  }

  /** QEMU was given garbage (garbage-shadow.ts): a warning, at most a few a minute. */
  private warnGarbage(peer: Peer, c: GuestCounterState): void {
    this.limiter.warn(
      'guest garbage',
      {
        vm: peer.vmId,
        pid: c.pid,
        garbageWindows: c.garbageWindows,
        garbageJ: (c.garbageUnits ?? 0) * this.o.unitJ,
        probe: peer.exits?.probe,
      },
      "guest energy: QEMU's arithmetic turned a window's delta into garbage (a thread exited after the reply): the guest's counter is off by garbageJ; docs/guest-energy.md \"Thread exits\"",
    );
  }

  /** A window's delta search met its bound (delta-solver.ts): answered 0, its energy carried; said once per process. */
  private logBounded(peer: Peer, c: GuestCounterState): void {
    delete c.bounded;
    if (this.boundLogged) return;
    this.boundLogged = true;
    this.o.log.warn(
      { vm: peer.vmId, pid: c.pid },
      "guest energy: a window's e_delta search met its bound (its threads give no credit QEMU's u64 can reach); answered 0 and carried, said once",
    );
  }

  /** The debug line of a window closed (`forecast`: answered from a forecast, else from the reads before the reply). */
  private logWindow(peer: Peer, c: GuestCounterState, forecast: boolean): void {
    if (!this.o.log.isLevelEnabled('debug')) return;
    this.o.log.debug(
      {
        vm: peer.vmId,
        pid: c.pid,
        window: c.windows,
        credited: c.creditedUnits,
        exact: Math.round(c.creditedUnits + c.owedUnits - (c.excessUnits ?? 0)),
        guest: c.loop.vpkgCounter,
        forecast,
        // What the helper attributed to each virtual package when it took `exact` (µJ).
        exact_vpkg_uj: peer.closedVpkgJ?.map((j) => Math.round(j * 1e6)),
        // Windows answered a zero delta for a possible thread exit, those with an exit seen right after a non-zero one, and garbage.
        exit_windows: peer.exitWindows,
        exit_causes: peer.exitCauses,
        late_exits: peer.lateExits,
        garbage_windows: c.garbageWindows ?? 0,
      },
      'guest window',
    );
  }

  /** Holds the window's task directory; lets go of those held past HOLD_LIMIT_NS (their QEMU stopped mid-window). */
  private hold(peer: Peer, count: TaskCount, now: bigint): void {
    for (const p of this.holding) if (now - (p.counter?.phases.startNs ?? 0n) > HOLD_LIMIT_NS) this.release(p);
    for (const p of this.watching) if (now - (p.counter?.phases.startNs ?? 0n) > HOLD_LIMIT_NS) this.unwatch(p);
    peer.taskCount = count;
    this.holding.add(peer);
  }

  private unwatch(peer: Peer): void {
    peer.exits?.close();
    delete peer.exits;
    this.watching.delete(peer);
  }

  private release(peer: Peer): void {
    peer.taskCount?.close();
    delete peer.taskCount;
    this.holding.delete(peer);
  }

  /** A window began: its vCPU threads are read now, the others once the reply has left (afterReplies). */
  private afterStart(peer: Peer, value: number): number {
    const c = peer.counter!;
    c.start = null;
    delete peer.runTimes;
    peer.vcpuTids = peer.nextVcpuTids ?? [...(this.o.find(c.pid)?.vcpus.keys() ?? [])];
    delete peer.nextVcpuTids;
    if (this.startFromSettled(peer, c)) return value;
    peer.early = this.reads.readEarly(c.pid, peer.vcpuTids);
    this.starting.push(peer);
    return value;
  }

  /**
   * After a settling's read: the task directory stays held and the read is kept, with the other
   * threads' run time, for the next window's start (startFromSettled); without a read, let go.
   */
  private keepForStart(peer: Peer, pid: number, read: StartRead | null): void {
    delete peer.settled;
    const vcpus = peer.nextVcpuTids;
    const othersNs = read === null || vcpus === undefined ? null : this.othersNs(pid, 'start', () => this.runTimesNs(pid, vcpus));
    // The main thread's run time read after the clock: what it ran since comes off what an unseen thread may have run (unseenCpuNs).
    const mainNs = othersNs !== null ? this.reads.mainRunNs(pid) : null;
    if (othersNs !== null) [peer.lastOthersNs, peer.lastMainNs] = [othersNs, mainNs];
    else delete peer.lastOthersNs;
    if (read === null || othersNs === null || peer.taskCount === undefined) return this.release(peer);
    peer.settled = { read, atNs: this.o.clock(), othersNs, mainNs };
  }

  /**
   * A window's start takes the last settling's read as its own when it comes within
   * SETTLED_START_NS of it and the process has exactly the threads that read found (one fstat of the
   * held task directory): nothing is read for it, before the reply or after. The boundary between
   * two windows is then one read, so whatever QEMU's reads are apart from it, a tick counted late at
   * one window's end is counted early at the next one's start, never twice and never lost.
   */
  private startFromSettled(peer: Peer, c: GuestCounterState): boolean {
    const s = peer.settled;
    delete peer.settled;
    const count = peer.taskCount;
    if (s === undefined || count === undefined || this.o.clock() - s.atNs > SETTLED_START_NS) return false;
    const now = count.now();
    if (now !== s.read.threads.size + 1) return false;
    count.first = now;
    c.start = s.read.threads;
    // Reads a tick apart (a loaded host): what the threads but the vCPUs ran meanwhile says whether one could have gone unseen.
    const gapNs = this.o.clock() - s.atNs;
    const mainNs = gapNs >= this.nsPerTick ? this.reads.mainRunNs(c.pid) : null;
    const others = gapNs >= this.nsPerTick ? this.othersNs(c.pid, 'start', () => this.runTimesNs(c.pid, peer.vcpuTids ?? [])) : null;
    const idle = idleAtList(s.read, Math.max(1, Number(gapNs)), this.nsPerTick);
    this.watch(peer, c.start.keys(), new Set(c.start.keys()), gapNs, {
      cpuNs: unseenCpuNs(others ?? undefined, s.othersNs, mainNs, s.mainNs),
      idle,
    });
    peer.runTimes = s.read.runTimes;
    peer.othersNs = s.othersNs;
    delete peer.lastRead;
    return true;
  }
}
