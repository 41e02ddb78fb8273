/** One VM's guest energy counters in exact mode (docs/guest-energy.md "How exact works"). */
import { creditOf, solveDelta } from './delta-solver.js';
import { copyLoopState, deltaTicks, freshLoopState, runIteration, type LoopState, type LoopThread } from './qemu-vmsr-loop.js';

// Whether a request is an iteration's e_start or e_end read. QEMU asks each host package its threads sat
// on, ascending; sleeps 1 s; asks the same packages again: anything else begins a start phase.

/** QEMU sleeps 1 s between the phases. */
const MIN_SLEEP_NS = 900_000_000n;

type PhaseKind = 'start' | 'end';

interface PhaseState {
  kind: PhaseKind | null;
  /** When the last start phase began (CLOCK_MONOTONIC). */
  startNs: bigint;
  pkgs: number[];
  /** In an end phase: how many of `pkgs` it has asked. */
  asked: number;
}

export function freshPhases(): PhaseState {
  return { kind: null, startNs: 0n, pkgs: [], asked: 0 };
}

function nextPhase(s: PhaseState, pkg: number, nowNs: bigint): { kind: PhaseKind; first: boolean } {
  if (s.kind === 'start') {
    if (nowNs - s.startNs >= MIN_SLEEP_NS && s.pkgs[0] === pkg) {
      s.kind = 'end';
      s.asked = 1;
      return { kind: 'end', first: true };
    }
    if (nowNs - s.startNs < MIN_SLEEP_NS && pkg > s.pkgs.at(-1)!) {
      s.pkgs.push(pkg);
      return { kind: 'start', first: false };
    }
  } else if (s.kind === 'end' && s.asked < s.pkgs.length && s.pkgs[s.asked] === pkg) {
    s.asked++;
    return { kind: 'end', first: false };
  }
  s.kind = 'start';
  s.startNs = nowNs;
  s.pkgs = [pkg];
  s.asked = 0;
  return { kind: 'start', first: true };
}

export interface ThreadRead {
  tid: number;
  ticks: number;
  /** Field 22: a different value under the same tid is another thread. */
  starttime: number;
  /** -1 when the CPU is not in the host map. */
  pkg: number;
}

/** By tid; the main thread (tid = pid) is never listed (QEMU skips it). */
export type ThreadSnapshot = ReadonlyMap<number, ThreadRead>;

export interface GuestVm {
  pid: number;
  /** vCPU tid -> virtual package. */
  vcpus: ReadonlyMap<number, number>;
  nvpkg: number;
}

/** Plain data (restart state); the optional fields are not saved. */
export interface GuestCounterState {
  vmId: number;
  pid: number;
  starttime: number;
  /** Per host package, in the guest's energy units. */
  counters: Map<number, number>;
  loop: LoopState;
  phases: PhaseState;
  start: ThreadSnapshot | null;
  /** Attributed, not yet credited (units; may be slightly below 0 when QEMU's carried share credited more). */
  owedUnits: number;
  creditedUnits: number;
  lastExactJ: number;
  /** Windows closed, and those that carried their energy (a thread underflowed or no vCPU ran). */
  windows: number;
  carriedWindows: number;
  /** Between a forecast answer and its settling (the same turn of the event loop). */
  answered?: Map<number, bigint>;
  /** Units QEMU credited from its garbage (the shadow below): exact = creditedUnits + owedUnits - excessUnits. */
  excessUnits?: number;
  shadow?: LoopState;
  /** Windows in which QEMU's credit differed from the shadow's, and by how many units. */
  garbageWindows?: number;
  garbageUnits?: number;
  /** Packages answered 0 because the delta search met its bound: the caller logs it once. */
  bounded?: number;
}

type CounterStep =
  | { kind: 'start'; first: boolean; value: number }
  | { kind: 'end'; first: true; needs: 'window' }
  | { kind: 'end'; first: false; value: number };

export function freshGuestCounter(vmId: number, pid: number, starttime: number, nvpkg: number, exactJ: number): GuestCounterState {
  return {
    vmId,
    pid,
    starttime,
    counters: new Map(),
    loop: freshLoopState(nvpkg),
    phases: freshPhases(),
    start: null,
    owedUnits: 0,
    creditedUnits: 0,
    lastExactJ: exactJ,
    windows: 0,
    carriedWindows: 0,
  };
}

/** A start read or a later end read is answered at once; a window's first end read needs closeWindow. */
export function counterStep(s: GuestCounterState, pkg: number, nowNs: bigint): CounterStep {
  const p = nextPhase(s.phases, pkg, nowNs);
  if (p.kind === 'end' && p.first) return { kind: 'end', first: true, needs: 'window' };
  if (p.kind === 'start' && p.first) s.start = null;
  return { kind: p.kind, first: p.first, value: s.counters.get(pkg) ?? 0 } as CounterStep;
}

function windowThreads(vm: GuestVm, start: ThreadSnapshot, end: ThreadSnapshot): { threads: LoopThread[]; replaced: Set<number> } {
  const threads: LoopThread[] = [];
  const replaced = new Set<number>();
  for (const a of start.values()) {
    if (a.tid === vm.pid) continue;
    const b = end.get(a.tid);
    if (b !== undefined && b.starttime !== a.starttime) replaced.add(a.pkg);
    threads.push({ tid: a.tid, pkg: a.pkg, ticks0: a.ticks, ticks1: b?.ticks ?? null, vpkg: vm.vcpus.get(a.tid) });
  }
  return { threads, replaced };
}

function takeAttributed(s: GuestCounterState, exactJ: number, unitJ: number): void {
  s.owedUnits += Math.max(0, exactJ - s.lastExactJ) / unitJ;
  s.lastExactJ = Math.max(s.lastExactJ, exactJ);
  s.windows++;
}

function advanceCounters(s: GuestCounterState, eDelta: ReadonlyMap<number, bigint>): void {
  for (const [p, e] of eDelta) s.counters.set(p, (s.counters.get(p) ?? 0) + Number(e));
}

/** A window's first end read: the package asked, the VM's energy attributed now, and `zero`: a listed thread may have exited. */
type WindowEnd = { pkg: number; exactJ: number; unitJ: number; maxTicks: ReadonlyMap<number, number>; zero?: boolean };

/** Closes the window at its first end read, on threads read before the reply; returns the value for `pkg`. */
export function closeWindow(s: GuestCounterState, vm: GuestVm, o: WindowEnd & { end: ThreadSnapshot }): number {
  takeAttributed(s, o.exactJ, o.unitJ);
  // Without a start read (the counters began mid-window) the end read stands in for it: no ticks, nothing credited.
  const { threads, replaced } = windowThreads(vm, s.start ?? o.end, o.end);
  const eDelta = o.zero === true ? new Map(s.phases.pkgs.map((p) => [p, 0n])) : solveWindow(s, threads, replaced, o.maxTicks);
  advanceCounters(s, eDelta);
  credit(s, { threads, eDelta, maxTicks: o.maxTicks });
  return s.counters.get(o.pkg) ?? 0;
}

/** Settles a window answered from a forecast (answerForecast) on the threads read right after that reply. */
export function settleWindow(s: GuestCounterState, vm: GuestVm, o: { end: ThreadSnapshot; maxTicks: ReadonlyMap<number, number> }): void {
  const eDelta = s.answered ?? new Map<number, bigint>();
  credit(s, { threads: windowThreads(vm, s.start ?? o.end, o.end).threads, eDelta, maxTicks: o.maxTicks });
}

// A window's end answered from a forecast, before its threads are read (docs/guest-energy.md, "Settling after the
// reply"): from upper bounds of the ticks, so the credit errs low; settleWindow carries the error.

/** ticks1: the forecast ticks at the window's end. */
export interface VcpuForecast {
  pkg: number;
  ticks0: number;
  ticks1: number;
}

/** Per package: the forecast vCPU ticks, the vCPUs that ran, and every vCPU that sat on it. */
function perPackage(vcpus: readonly VcpuForecast[]) {
  const out = new Map<number, { ticks: number; ran: number; vcpus: number }>();
  for (const v of vcpus) {
    let f = out.get(v.pkg);
    if (f === undefined) out.set(v.pkg, (f = { ticks: 0, ran: 0, vcpus: 0 }));
    f.vcpus++;
    const d = v.ticks1 - v.ticks0;
    if (d > 0) {
      f.ticks += d;
      f.ran++;
    }
  }
  return out;
}

/** closeWindow from a forecast, `otherTicks` at least the non-vCPU threads' ticks QEMU listed; the e_delta answered kept in `s.answered` for settleWindow. */
export function answerForecast(s: GuestCounterState, o: WindowEnd & { vcpus: readonly VcpuForecast[]; otherTicks: number }): number {
  takeAttributed(s, o.exactJ, o.unitJ);
  const fc = perPackage(o.vcpus);
  // QEMU's credit from package p, linear in e: e x (V + ran x O / nb) / maxticks + ran x C / nb, with
  // V the vCPU ticks, O the non-vCPU ticks, C the carried share and nb the vCPU count after this window.
  const slope = new Map<number, number>();
  let base = 0;
  let ticks = 0;
  for (const p of s.phases.pkgs) {
    const f = fc.get(p);
    if (f === undefined || f.ran === 0) continue;
    const nb = (s.loop.nbVcpu.get(p) ?? 0) + f.vcpus;
    base += f.ran * Math.floor(Number(s.loop.eRatio.get(p) ?? 0n) / nb);
    slope.set(p, (f.ticks + (f.ran * o.otherTicks) / nb) / (o.maxTicks.get(p) ?? 1));
    ticks += f.ticks;
  }
  // Split between the packages by their vCPU ticks, as solveWindow does.
  const target = Math.max(0, Math.floor(s.owedUnits) - base);
  const eDelta = new Map<number, bigint>();
  for (const p of s.phases.pkgs) {
    const k = slope.get(p);
    const e = k === undefined || s.start === null || o.zero === true ? 0 : Math.floor((target * fc.get(p)!.ticks) / ticks / k);
    eDelta.set(p, BigInt(Math.max(0, e)));
  }
  advanceCounters(s, eDelta);
  s.answered = eDelta;
  return s.counters.get(o.pkg) ?? 0;
}

function solveWindow(
  s: GuestCounterState,
  threads: readonly LoopThread[],
  replaced: ReadonlySet<number>,
  allTicks: ReadonlyMap<number, number>,
): Map<number, bigint> {
  const pkgs = s.phases.pkgs;
  const ofPkg = (p: number) => threads.filter((t) => t.pkg === p);
  const maxTicks = (p: number) => allTicks.get(p) ?? 1;
  // What QEMU credits from its carried share whatever it is given comes off the target first.
  const base = new Map(pkgs.map((p) => [p, creditOf({ state: s.loop, pkg: p, threads: ofPkg(p), maxTicks: maxTicks(p) })(0n)]));
  let baseSum = 0;
  for (const b of base.values()) baseSum += Number(b);
  const shares = splitTarget(Math.max(0, Math.floor(s.owedUnits) - baseSum), pkgs, threads);
  const eDelta = new Map<number, bigint>();
  for (const p of pkgs) {
    const paid = replaced.has(p) || s.start === null ? 0 : (shares.get(p) ?? 0);
    const e = solveDelta({ state: s.loop, pkg: p, threads: ofPkg(p), maxTicks: maxTicks(p), target: base.get(p)! + BigInt(paid) });
    if (e === null) s.bounded = (s.bounded ?? 0) + 1;
    eDelta.set(p, e ?? 0n);
  }
  return eDelta;
}

function credit(s: GuestCounterState, w: Parameters<typeof runIteration>[1]): void {
  // The shadow running, or a copy of the loop when a thread underflows on a package given a non-zero e_delta.
  const shadow =
    s.shadow ?? (w.threads.some((t) => underflowed(t) && (w.eDelta.get(t.pkg) ?? 0n) > 0n) ? copyLoopState(s.loop) : undefined);
  const credits = runIteration(s.loop, w);
  // What the guest's 32-bit counters show (all of it but with garbage).
  let credited = 0;
  for (const c of credits) credited += Number(BigInt.asUintN(32, c));
  let paid = credited;
  if (shadow !== undefined) {
    const clean = shadowCredit(shadow, w);
    paid = Math.min(credited, clean);
    if (clean !== credited) {
      s.garbageWindows = (s.garbageWindows ?? 0) + 1;
      s.garbageUnits = (s.garbageUnits ?? 0) + Math.abs(credited - clean);
    }
    s.excessUnits = (s.excessUnits ?? 0) + credited - paid;
    // Garbage gone: QEMU's carried shares are the shadow's again.
    if ([...s.loop.eRatio].every(([p, r]) => (shadow.eRatio.get(p) ?? 0n) === r)) delete s.shadow;
    else s.shadow = shadow;
  }
  if (credited === 0 && s.owedUnits >= 1) s.carriedWindows++;
  s.creditedUnits += credited;
  s.owedUnits -= paid;
  s.start = null;
  delete s.answered;
}

/** In proportion to the vCPU ticks QEMU will see on each package (the only way it credits one); the last gets the remainder. */
function splitTarget(target: number, pkgs: readonly number[], threads: readonly LoopThread[]): Map<number, number> {
  const ticks = new Map<number, number>();
  let all = 0;
  for (const t of threads) {
    if (t.vpkg === undefined || t.ticks1 === null || t.ticks1 <= t.ticks0) continue;
    ticks.set(t.pkg, (ticks.get(t.pkg) ?? 0) + t.ticks1 - t.ticks0);
    all += t.ticks1 - t.ticks0;
  }
  const out = new Map<number, number>();
  if (all === 0) return out;
  let left = target;
  const paid = pkgs.filter((p) => (ticks.get(p) ?? 0) > 0);
  paid.forEach((p, i) => {
    const share = i === paid.length - 1 ? left : Math.floor((target * ticks.get(p)!) / all);
    out.set(p, share);
    left -= share;
  });
  return out;
}

// A peer listens (answered raw, its windows counted so the model's vCPU count starts right) until its VM is
// known and modelled. After a restart either answers 0 until a request comes soon after the last (`resyncNs`).
export type Exact<W> = { at: 'exact'; counter: GuestCounterState } & W;

export interface PeerPhase<W> {
  phase: { at: 'listening'; phases: PhaseState; windowsSeen: number } | Exact<W>;
  resyncNs?: bigint;
}

/** 'begin': try exact from this window on; 'exact': the counters' step. */
export function requestStep<W>(p: PeerPhase<W>, pkg: number, nowNs: bigint): 'zero' | 'raw' | 'begin' | 'exact' {
  const s = p.phase;
  if (p.resyncNs !== undefined) {
    const last = p.resyncNs;
    p.resyncNs = nowNs;
    if (nowNs - last >= MIN_SLEEP_NS) return 'zero';
    delete p.resyncNs;
    if (s.at === 'exact') s.counter.phases = freshPhases();
    else s.phases = freshPhases();
  }
  if (s.at === 'exact') return 'exact';
  const step = nextPhase(s.phases, pkg, nowNs);
  if (step.kind !== 'start' || !step.first) return 'raw';
  s.windowsSeen++;
  return 'begin';
}

// QEMU's garbage (docs/guest-energy.md, "Limits"): an exit's underflowed share in QEMU's never-reset e_ratio.
// A shadow loop without it says what the guest is owed while the garbage decays.

const U64_HALF = 1n << 63n;

function underflowed(t: LoopThread): boolean {
  return deltaTicks(t) >= U64_HALF;
}

/** QEMU's iteration on the shadow (in place) with every underflowed delta counted 0. */
function shadowCredit(shadow: LoopState, w: Parameters<typeof runIteration>[1]): number {
  const threads = w.threads.map((t) => (underflowed(t) ? { ...t, ticks1: t.ticks0 } : t));
  let sum = 0;
  for (const c of runIteration(shadow, { ...w, threads })) sum += Number(c);
  return sum;
}
