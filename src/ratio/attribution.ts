/**
 * The ratio engine: splits package energy across the threads of registered VMs, exactly as
 * docs/ratio.md ("ticks" mode) says, in float64. Pure: no clock, no files; the caller
 * hands it samples (live sampler or trace replay). docs/ratio.md maps each rule to the code below
 * and records the decisions where those rules are silent.
 */
import { joulesPerCounterUnit, packageCounter } from './counter.js';
import { payClaims, type PackagePay } from './overclaim.js';
import { parseStatLine } from './stat.js';
import { validVcpus } from './vcpus.js';
import type { EngineState, EngineVmState } from './engine-state.js';
import { PLATFORM_DOMAINS, type OtherDomain } from './domains.js';
import { domainCounterProblem } from './domain-counters.js';
import {
  MAX_TID,
  type DomainCounter,
  type DomainInterval,
  type HostInfo,
  type IntervalResult,
  type PackageInterval,
  type Sample,
  type VcpuSpec,
  type VmInterval,
  type VmOutput,
  type VmDomainEnergy,
  type VmSpec,
  type VpkgOutput,
} from './types.js';

const TWO_32 = 2 ** 32;

/**
 * tid -> vpkg of a vCPU list, by the one vCPU-list rule (ratio/vcpus.ts); throws its message. The
 * engine alone takes an empty list: a VM none of whose vCPU threads is known gets no energy until
 * updateVcpus names some. Every way a VM arrives from outside (v2 REGISTER, --vcpus, a trace)
 * refuses an empty list before it gets here.
 */
function checkedVcpus(vcpus: readonly VcpuSpec[]): Map<number, number> {
  const out = new Map<number, number>();
  for (const v of validVcpus(vcpus, { allowEmpty: true })) out.set(v.tid, v.vpkg);
  return out;
}

/** What the previous sample said about one thread; (tid, starttime) is its identity. */
interface ThreadMark {
  starttime: number;
  ticks: number;
}

/** The fields of a stat line the rules use. */
interface ThreadStat extends ThreadMark {
  processor: number;
}

/**
 * A thread's line as last parsed, reused while the sampler hands the same line again (an idle
 * thread's line does not change): parsing is a pure function of the line, so this changes nothing
 * but the cost.
 */
interface ParsedLine {
  line: string;
  /** null: the line counts as absent, for `problem`. */
  stat: ThreadStat | null;
  problem: string;
}

type Phase = 'pending' | 'active' | 'ended';

interface VmState {
  id: number;
  spec: VmSpec;
  /** Registered vCPU tid -> vpkg. */
  vcpuVpkg: Map<number, number>;
  nvpkg: number;
  phase: Phase;
  /** Threads seen in the previous sample (active VMs only). */
  prev: Map<number, ThreadMark>;
  /** tid -> its last line, parsed (live VMs only). */
  parsed: Map<number, ParsedLine>;
  /** A(v,g), joules. */
  acc: number[];
  /** A(v,g) of each other domain the host reads (DomainPlane order), joules. */
  domainAcc: number[][];
  /** Sample time of the published values; 0n before the first interval. */
  tNs: bigint;
  /** Set when phase becomes 'ended'. */
  endedBy?: 'exit' | 'unregister';
  /** Per thread since the baseline: energy given to it as a vCPU (its share and its part of W), J, and its ticks. */
  threads?: Map<number, { energyJ: number; ticks: number }>;
}

/** A VM's per-thread totals since its baseline (RatioEngine.threadTotals). */
export interface ThreadTotals {
  /** In the order of the VM's vCPU list; a vCPU not yet seen has 0. */
  vcpus: { tid: number; vpkg: number; energyJ: number; ticks: number }[];
  /** Ticks of every thread that is not a vCPU (emulator, I/O threads), summed. */
  otherTicks: number;
}

/** A thread of an active VM in the current sample, after parsing. */
interface ThreadNow {
  tid: number;
  dticks: number;
  /** Host package of `processor`; undefined when the CPU is not in the host map. */
  pkg: number | undefined;
  /** vpkg when this tid is a registered vCPU. */
  vpkg: number | undefined;
}

/** A RAPL domain other than the package, as the engine attributes it (docs/ratio.md, "Other RAPL domains"). */
interface DomainPlane {
  domain: OtherDomain;
  /** Counted once for the host, shared across every package's VMs (psys). */
  platform: boolean;
  /** Per package that has the counter (a platform domain: one, the lowest with it): its range and unit. */
  counters: Map<number, { range: bigint; unitJ: number }>;
}

/**
 * How one domain's energy of an interval is paid (the package's, or another's): per package its energy
 * and how its claims are paid (ratio/overclaim.ts). A platform domain has one entry, keyed by
 * PLATFORM_KEY, whose capacity is every CPU's.
 */
interface PlaneInterval {
  energy: Map<number, number>;
  pay: ReadonlyMap<number, PackagePay>;
  platform: boolean;
  /** Energy given to claims on each package (platform: under PLATFORM_KEY). */
  attributed: Map<number, number>;
  /** Energy paid to claims beyond their package's capacity out of the other packages' leftover. */
  lent: number;
}

/** The one key of a platform domain's PlaneInterval maps: no package has it. */
const PLATFORM_KEY = -1;

/** The pay of an interval where no thread claimed anything (planeInterval): nothing in it, never written. */
const NO_PAY: ReadonlyMap<number, PackagePay> = new Map();

export class RatioEngine {
  /** MSR_RAPL_POWER_UNIT of host package 0 (or of the lowest-numbered package when there is no 0). */
  readonly guestPowerUnit: bigint;
  private readonly uGuest: number;
  private readonly clkTck: number;
  private readonly cpuPackage = new Map<number, number>();
  /** n_p: online CPUs per package. */
  private readonly cpusPerPackage = new Map<number, number>();
  /** u_p: joules per counter unit, per package. */
  private readonly unit = new Map<number, number>();
  /** Per package: its energy counter's range (HostPackage.counter; a RAPL MSR's 2^32 when absent). */
  private readonly range = new Map<number, bigint>();
  private readonly packageIds: number[];
  private readonly vms = new Map<number, VmState>();
  private nextId = 1;
  private prevT: bigint | undefined;
  /** Low 32 bits of R_p in the previous sample; a package missing there has no entry. */
  private prevEnergy = new Map<number, number>();
  /** The other domains the host reads, in the order HostInfo.domains gives them (ENERGY_DOMAINS order). */
  private readonly planes: DomainPlane[] = [];
  /** A domain's index in `planes`. */
  private readonly planeOf = new Map<string, number>();
  /** Per count of virtual packages: every domain at 0, what an idle VM's interval gives (shared, read only). */
  private readonly idle = new Map<number, VmDomainEnergy[]>();
  /**
   * Per domain plane, per package: the counter mod range at the last sample that had it. A value
   * missing from a sample keeps the last one, so the next value spans the gap (docs/ratio.md).
   */
  private prevDomain: Map<number, number>[] = [];
  /** Problems found in the last addSample, also when it returned null (the first sample). */
  lastProblems: string[] = [];

  constructor(host: HostInfo) {
    if (!Number.isFinite(host.clkTck) || host.clkTck <= 0) throw new Error(`CLK_TCK must be a positive number, got ${host.clkTck}`);
    if (host.packages.length === 0) throw new Error('the host has no packages');
    this.clkTck = host.clkTck;
    for (const p of host.packages) {
      if (this.unit.has(p.package)) throw new Error(`package ${p.package} is listed twice`);
      const counter = packageCounter(p);
      this.unit.set(p.package, counter.unitJ);
      this.range.set(p.package, counter.range);
      this.cpusPerPackage.set(p.package, 0);
    }
    for (const c of host.cpus) {
      if (this.cpuPackage.has(c.cpu)) throw new Error(`cpu ${c.cpu} is listed twice`);
      const n = this.cpusPerPackage.get(c.package);
      if (n === undefined) throw new Error(`cpu ${c.cpu} is in package ${c.package}, which is not among the host's packages`);
      this.cpuPackage.set(c.cpu, c.package);
      this.cpusPerPackage.set(c.package, n + 1);
    }
    this.packageIds = [...this.unit.keys()].sort((a, b) => a - b);
    const counters = host.domains ?? [];
    counters.forEach((d, i) => this.addDomainCounter(d, counters.slice(0, i)));
    this.prevDomain = this.planes.map(() => new Map());
    const guest = host.packages.find((p) => p.package === 0) ?? host.packages.find((p) => p.package === this.packageIds[0]);
    this.guestPowerUnit = guest!.powerUnit;
    this.uGuest = joulesPerCounterUnit(this.guestPowerUnit);
  }

  /** Takes one DomainCounter of the host (those before it already taken), or throws naming what is wrong with it. */
  private addDomainCounter(d: DomainCounter, before: readonly DomainCounter[]): void {
    const problem = domainCounterProblem(d, this.unit, before);
    if (problem !== undefined) throw new Error(problem);
    let i = this.planeOf.get(d.domain);
    if (i === undefined) {
      this.planeOf.set(d.domain, (i = this.planes.length));
      this.planes.push({ domain: d.domain, platform: PLATFORM_DOMAINS.has(d.domain), counters: new Map() });
    }
    this.planes[i]!.counters.set(d.package, { range: d.range, unitJ: d.unitJ });
  }

  /** The other domains the host reads, in the order they are attributed. */
  domains(): OtherDomain[] {
    return this.planes.map((p) => p.domain);
  }

  register(vm: VmSpec): number {
    const vcpuVpkg = checkedVcpus(vm.vcpus);
    let nvpkg = 0;
    for (const g of vcpuVpkg.values()) nvpkg = Math.max(nvpkg, g + 1);
    const id = this.nextId++;
    this.vms.set(id, {
      id,
      spec: { ...vm, vcpus: vm.vcpus.map((v) => ({ ...v })) },
      vcpuVpkg,
      nvpkg,
      phase: 'pending',
      prev: new Map(),
      parsed: new Map(),
      acc: new Array<number>(nvpkg).fill(0),
      domainAcc: this.planes.map(() => new Array<number>(nvpkg).fill(0)),
      tNs: 0n,
    });
    return id;
  }

  /**
   * Replaces a VM's vCPU list from the next sample on (vCPU hotplug, a thread renamed, a client's
   * registration taking over a discovered VM). Accumulated energy is kept; nvpkg only grows, so a
   * published counter never goes backwards. Same checks as register.
   */
  updateVcpus(vmId: number, vcpus: readonly VcpuSpec[]): void {
    const vm = this.vms.get(vmId);
    if (!vm) throw new Error(`no VM ${vmId}`);
    const vcpuVpkg = checkedVcpus(vcpus);
    let nvpkg = vm.nvpkg;
    for (const g of vcpuVpkg.values()) nvpkg = Math.max(nvpkg, g + 1);
    vm.vcpuVpkg = vcpuVpkg;
    vm.spec = { ...vm.spec, vcpus: vcpus.map((v) => ({ ...v })) };
    while (vm.acc.length < nvpkg) vm.acc.push(0);
    for (const a of vm.domainAcc) while (a.length < nvpkg) a.push(0);
    vm.nvpkg = nvpkg;
  }

  unregister(vmId: number): void {
    const vm = this.vms.get(vmId);
    if (vm && vm.phase !== 'ended') this.end(vm, 'unregister');
  }

  forget(vmId: number): void {
    this.vms.delete(vmId);
  }

  nvpkg(vmId: number): number {
    return this.vms.get(vmId)?.nvpkg ?? 0;
  }

  activePids(): number[] {
    const pids = new Set<number>();
    for (const vm of this.vms.values()) if (vm.phase !== 'ended') pids.add(vm.spec.pid);
    return [...pids];
  }

  output(vmId: number): VmOutput | undefined {
    const vm = this.vms.get(vmId);
    return vm && this.publish(vm);
  }

  /** Whether the VM has ended or is not known: what output(vmId)?.ended ?? true says, without building the output. */
  ended(vmId: number): boolean {
    return (this.vms.get(vmId)?.phase ?? 'ended') === 'ended';
  }

  outputs(): VmOutput[] {
    return [...this.vms.values()].map((vm) => this.publish(vm));
  }

  /** A VM's per-thread totals since its baseline (the statistics fd's per-vCPU values), or undefined for no such VM. */
  threadTotals(vmId: number): ThreadTotals | undefined {
    const vm = this.vms.get(vmId);
    if (!vm) return undefined;
    const t = vm.threads;
    let vcpuTicks = 0;
    const vcpus = vm.spec.vcpus.map((v) => {
      const k = t?.get(v.tid);
      vcpuTicks += k?.ticks ?? 0;
      return { tid: v.tid, vpkg: v.vpkg, energyJ: k?.energyJ ?? 0, ticks: k?.ticks ?? 0 };
    });
    let all = 0;
    if (t) for (const k of t.values()) all += k.ticks;
    return { vcpus, otherTicks: Math.max(0, all - vcpuTicks) };
  }

  /** Adds one interval's energy (vCPUs: share + extra) and ticks to each thread's totals. */
  private addThreadTotals(vm: VmState, threads: readonly ThreadNow[], es: readonly number[], extra: number): void {
    const totals = (vm.threads ??= new Map());
    for (let i = 0; i < threads.length; i++) {
      const th = threads[i]!;
      if (th.dticks === 0 && th.vpkg === undefined) continue;
      let k = totals.get(th.tid);
      if (k === undefined) totals.set(th.tid, (k = { energyJ: 0, ticks: 0 }));
      k.ticks += th.dticks;
      if (th.vpkg !== undefined) k.energyJ += es[i]! + extra;
    }
  }

  /** Number of the last sample's time, for callers that want to check ordering themselves. */
  /**
   * Samples are missing (a trace's gap): the next sample is a new baseline for the energy counters
   * and for every live VM's threads, as for a first sample; nothing is attributed across the gap.
   */
  gap(): void {
    this.prevT = undefined;
    this.prevEnergy = new Map();
    this.prevDomain = this.planes.map(() => new Map());
    for (const vm of this.vms.values()) if (vm.phase === 'active') vm.phase = 'pending';
  }

  lastSampleNs(): bigint | undefined {
    return this.prevT;
  }

  /**
   * The whole state as plain data (copies): every VM's registration, phase, A(v,g) and last marks, the
   * last sample's time and counters. restore() on a new engine of the same host takes it back.
   */
  state(): EngineState {
    const vms: EngineVmState[] = [...this.vms.values()].map((vm) => {
      const out: EngineVmState = {
        id: vm.id,
        pid: vm.spec.pid,
        starttime: vm.spec.starttime,
        vcpus: vm.spec.vcpus.map((v) => ({ ...v })),
        phase: vm.phase,
        accJ: [...vm.acc],
        tNs: vm.tNs,
        prev: [...vm.prev].map(([tid, m]) => ({ tid, starttime: m.starttime, ticks: m.ticks })),
      };
      if (this.planes.length > 0) out.domainAccJ = this.planes.map((p, i) => ({ domain: p.domain, accJ: [...vm.domainAcc[i]!] }));
      if (vm.spec.name !== undefined) out.name = vm.spec.name;
      if (vm.endedBy !== undefined) out.endedBy = vm.endedBy;
      return out;
    });
    let lastSample: EngineState['lastSample'] = null;
    if (this.prevT !== undefined) {
      lastSample = { tNs: this.prevT, energy: [...this.prevEnergy].map(([pkg, raw]) => ({ pkg, raw })) };
      const domains = this.planes.flatMap((p, i) => [...this.prevDomain[i]!].map(([pkg, raw]) => ({ domain: p.domain, pkg, raw })));
      if (domains.length > 0) lastSample.domains = domains;
    }
    return { nextId: this.nextId, lastSample, vms };
  }

  /**
   * Takes back what state() gave, on an engine that has no VM and no sample yet: the next sample then
   * closes the interval from `s.lastSample`, as if the engine had never stopped. Throws an Error naming
   * the first inconsistent value, before changing anything.
   */
  restore(s: EngineState): void {
    if (this.vms.size > 0 || this.prevT !== undefined || this.nextId !== 1)
      throw new Error('only an engine with no VM and no sample can be restored');
    const problem = this.restoreProblem(s);
    if (problem !== null) throw new Error(problem);
    for (const v of s.vms) {
      const spec: VmSpec = { pid: v.pid, starttime: v.starttime, vcpus: v.vcpus.map((c) => ({ ...c })) };
      if (v.name !== undefined) spec.name = v.name;
      const vm: VmState = {
        id: v.id,
        spec,
        vcpuVpkg: checkedVcpus(v.vcpus),
        nvpkg: v.accJ.length,
        phase: v.phase,
        prev: new Map(v.prev.map((m) => [m.tid, { starttime: m.starttime, ticks: m.ticks }])),
        parsed: new Map(),
        acc: [...v.accJ],
        // A domain this engine reads that the state lacks starts at 0; one it does not read is dropped.
        domainAcc: this.planes.map((p) => {
          const acc = v.domainAccJ?.find((d) => d.domain === p.domain)?.accJ ?? [];
          return Array.from({ length: v.accJ.length }, (_, g) => acc[g] ?? 0);
        }),
        tNs: v.tNs,
      };
      if (v.phase === 'ended') vm.endedBy = v.endedBy ?? 'exit';
      this.vms.set(v.id, vm);
    }
    this.nextId = s.nextId;
    if (s.lastSample !== null) {
      this.prevT = s.lastSample.tNs;
      this.prevEnergy = new Map(s.lastSample.energy.map((e) => [e.pkg, e.raw]));
      for (const d of s.lastSample.domains ?? []) {
        const i = this.planeOf.get(d.domain);
        if (i !== undefined && this.planes[i]!.counters.has(d.pkg)) this.prevDomain[i]!.set(d.pkg, d.raw);
      }
    }
  }

  private restoreProblem(s: EngineState): string | null {
    if (!Number.isSafeInteger(s.nextId) || s.nextId < 1) return `the next VM id ${s.nextId} is not a positive integer`;
    const last = s.lastSample;
    if (last !== null) {
      if (last.tNs < 0n) return `the last sample's time ${last.tNs} ns is negative`;
      const seen = new Set<number>();
      for (const e of last.energy) {
        if (!this.unit.has(e.pkg)) return `the last sample has a counter for package ${e.pkg}, which the host does not have`;
        if (seen.has(e.pkg)) return `the last sample has package ${e.pkg} twice`;
        seen.add(e.pkg);
        if (!Number.isSafeInteger(e.raw) || e.raw < 0 || e.raw >= Number(this.range.get(e.pkg)!))
          return `package ${e.pkg}'s counter ${e.raw} is out of its range (0..${this.range.get(e.pkg)! - 1n})`;
      }
      for (const d of last.domains ?? []) {
        const c = this.planes.find((p) => p.domain === d.domain)?.counters.get(d.pkg);
        // A domain this engine does not read is ignored; one it reads must fit its counter.
        if (c !== undefined && (!Number.isSafeInteger(d.raw) || d.raw < 0 || d.raw >= Number(c.range)))
          return `the ${d.domain} counter ${d.raw} of package ${d.pkg} is out of its range`;
      }
    }
    const ids = new Set<number>();
    for (const v of s.vms) {
      const at = `VM ${v.id}`;
      if (!Number.isSafeInteger(v.id) || v.id < 1 || v.id >= s.nextId) return `VM id ${v.id} is out of range (1..${s.nextId - 1})`;
      if (ids.has(v.id)) return `VM id ${v.id} appears twice`;
      ids.add(v.id);
      if (!Number.isInteger(v.pid) || v.pid < 1 || v.pid > MAX_TID) return `${at}: pid ${v.pid} is out of range`;
      if (!Number.isSafeInteger(v.starttime) || v.starttime < 0) return `${at}: starttime ${v.starttime} is not a whole number of ticks`;
      let nvpkg = 0;
      try {
        for (const g of checkedVcpus(v.vcpus).values()) nvpkg = Math.max(nvpkg, g + 1);
      } catch (e) {
        return `${at}: ${(e as Error).message}`;
      }
      if (v.accJ.length < nvpkg) return `${at}: ${v.accJ.length} energy totals for ${nvpkg} virtual packages`;
      if (v.accJ.some((a) => !Number.isFinite(a) || a < 0)) return `${at}: an energy total is not a finite number of joules >= 0`;
      for (const d of v.domainAccJ ?? []) {
        if (d.accJ.length > v.accJ.length) return `${at}: ${d.accJ.length} ${d.domain} totals for ${v.accJ.length} virtual packages`;
        if (d.accJ.some((a) => !Number.isFinite(a) || a < 0))
          return `${at}: a ${d.domain} energy total is not a finite number of joules >= 0`;
      }
      if (v.tNs < 0n || (last !== null && v.tNs > last.tNs)) return `${at}: its values' time ${v.tNs} ns is after the last sample`;
      if (v.phase !== 'pending' && v.phase !== 'active' && v.phase !== 'ended') return `${at}: unknown phase ${String(v.phase)}`;
      if (v.phase === 'active' && last === null) return `${at} has had its baseline sample, but there is no last sample`;
      if (v.phase !== 'active' && v.prev.length > 0) return `${at} is ${v.phase} but has thread marks`;
      const tids = new Set<number>();
      for (const m of v.prev) {
        if (tids.has(m.tid)) return `${at}: thread ${m.tid} is marked twice`;
        tids.add(m.tid);
        if (!Number.isSafeInteger(m.ticks) || m.ticks < 0 || !Number.isSafeInteger(m.starttime) || m.starttime < 0)
          return `${at}: thread ${m.tid}'s mark is out of range`;
      }
    }
    return null;
  }

  addSample(s: Sample): IntervalResult | null {
    // Validate before touching any state, so a rejected sample leaves the engine as it was.
    if (this.prevT !== undefined && s.tNs <= this.prevT) {
      throw new Error(`sample time ${s.tNs} ns is not after the previous sample (${this.prevT} ns)`);
    }
    const problems: string[] = [];
    const energyNow = new Map<number, number>();
    for (const [pkg, raw] of s.energy) {
      if (!this.unit.has(pkg)) {
        problems.push(`energy given for package ${pkg}, which the host does not have: ignored`);
        continue;
      }
      energyNow.set(pkg, Number(raw % this.range.get(pkg)!));
    }
    for (const pkg of this.packageIds) if (!energyNow.has(pkg)) problems.push(`no energy value for package ${pkg} in this sample`);
    const domainNow = this.domainValues(s, problems);

    const prevT = this.prevT;
    const prevEnergy = this.prevEnergy;
    const prevDomain = this.prevDomain;
    this.prevT = s.tNs;
    this.prevEnergy = energyNow;
    // A domain value missing now keeps the last one: the next value spans the gap.
    this.prevDomain = prevDomain.map((before, i) => {
      const now = domainNow[i]!;
      if (now.size === this.planes[i]!.counters.size) return now; // every value read: nothing to keep
      const kept = new Map(now);
      for (const [pkg, v] of before) if (!kept.has(pkg)) kept.set(pkg, v);
      return kept;
    });

    let result: IntervalResult | null = null;
    const ended: number[] = [];
    if (prevT !== undefined) result = this.interval(s, prevT, prevEnergy, energyNow, prevDomain, domainNow, problems, ended);
    // VMs registered since the previous sample take this one as their baseline.
    for (const vm of this.vms.values()) {
      if (vm.phase !== 'pending') continue;
      const threads = this.aliveThreads(vm, s, problems);
      if (threads === null) {
        this.end(vm);
        ended.push(vm.id);
        continue;
      }
      vm.phase = 'active';
      vm.prev = new Map();
      for (const [tid, st] of threads) vm.prev.set(tid, st);
    }
    if (result) {
      result.ended = ended;
      result.problems = problems;
    }
    this.lastProblems = problems;
    return result;
  }

  /** Per domain plane, per package: the sample's counter mod range. Readings the host does not have are reported and left out. */
  private domainValues(s: Sample, problems: string[]): Map<number, number>[] {
    const out = this.planes.map(() => new Map<number, number>());
    for (const r of s.domains ?? []) {
      const i = this.planeOf.get(r.domain);
      const c = i === undefined ? undefined : this.planes[i]!.counters.get(r.package);
      if (c === undefined) {
        problems.push(`${String(r.domain)} energy given for package ${r.package}, which the host does not read: ignored`);
        continue;
      }
      out[i!]!.set(r.package, Number(r.raw % c.range));
    }
    for (let i = 0; i < this.planes.length; i++) {
      const p = this.planes[i]!;
      if (out[i]!.size === p.counters.size) continue; // every value there
      for (const pkg of p.counters.keys())
        if (!out[i]!.has(pkg)) problems.push(`no ${p.domain} energy value for package ${pkg} in this sample`);
    }
    return out;
  }

  private interval(
    s: Sample,
    prevT: bigint,
    prevEnergy: Map<number, number>,
    energyNow: Map<number, number>,
    prevDomain: Map<number, number>[],
    domainNow: Map<number, number>[],
    problems: string[],
    ended: number[],
  ): IntervalResult {
    const dt = Number(s.tNs - prevT) / 1e9;
    // dE_p only where both samples have the counter; a gap makes the next value a new baseline.
    const dE = new Map<number, number>();
    for (const pkg of this.packageIds) {
      const a = prevEnergy.get(pkg);
      const b = energyNow.get(pkg);
      if (a === undefined || b === undefined) continue;
      const units = b >= a ? b - a : b - a + Number(this.range.get(pkg)!);
      dE.set(pkg, units * this.unit.get(pkg)!);
    }

    // Pass 1: who is still alive, each thread's dticks and package, D_p.
    const live: { vm: VmState; threads: ThreadNow[] | null }[] = [];
    const ticksOnPkg = new Map<number, number>();
    for (const vm of this.vms.values()) {
      if (vm.phase !== 'active') continue;
      if (this.unchanged(vm, s)) {
        // Every line as in the previous sample: every dticks is 0, nothing to attribute, the marks stay.
        live.push({ vm, threads: null });
        continue;
      }
      const now = this.aliveThreads(vm, s, problems);
      if (now === null) {
        this.end(vm);
        ended.push(vm.id);
        continue;
      }
      const threads: ThreadNow[] = [];
      const marks = new Map<number, ThreadMark>();
      for (const [tid, st] of now) {
        const before = vm.prev.get(tid);
        let dticks = before !== undefined && before.starttime === st.starttime ? st.ticks - before.ticks : st.ticks;
        if (dticks < 0) dticks = 0;
        const pkg = this.cpuPackage.get(st.processor);
        if (pkg === undefined) {
          problems.push(
            `pid ${vm.spec.pid} tid ${tid}: ran on cpu ${st.processor}, which the host map does not have: no energy for it this interval`,
          );
        } else {
          ticksOnPkg.set(pkg, (ticksOnPkg.get(pkg) ?? 0) + dticks);
        }
        threads.push({ tid, dticks, pkg, vpkg: vm.vcpuVpkg.get(tid) });
        marks.set(tid, st);
      }
      vm.prev = marks;
      live.push({ vm, threads });
    }

    // e_k = dE_p * dticks / cap_p; ticks claimed beyond cap_p are paid from the other packages' leftover
    // first, and only what that cannot cover scales the package's claims down (ratio/overclaim.ts).
    // Every other domain is paid the same way, with its own energy (docs/ratio.md, "Other RAPL domains").
    const capacity = (pkg: number): number => this.clkTck * dt * this.cpusPerPackage.get(pkg)!;
    const pkgPlane = this.planeInterval(dE, false, capacity, ticksOnPkg);
    const planes = this.planes.map((p, i) =>
      this.planeInterval(this.domainEnergy(p, prevDomain[i]!, domainNow[i]!), p.platform, capacity, ticksOnPkg),
    );

    const vmsOut: VmInterval[] = [];
    for (const { vm, threads } of live) {
      vm.tNs = s.tNs;
      if (threads === null) {
        const out: VmInterval = { vmId: vm.id, pid: vm.spec.pid, vpkgEnergyJ: new Array<number>(vm.nvpkg).fill(0) };
        if (this.planes.length > 0) out.domains = this.idleDomains(vm.nvpkg);
        vmsOut.push(out);
        continue;
      }
      const es: number[] = new Array<number>(threads.length);
      const pkgSplit = this.split(pkgPlane, vm, threads, es);
      this.addThreadTotals(vm, threads, es, pkgSplit.extra);
      // With no vCPU present, W is dropped and nothing is attributed on any package.
      for (let g = 0; g < vm.nvpkg; g++) vm.acc[g] = vm.acc[g]! + pkgSplit.vpkg[g]!;
      const out: VmInterval = { vmId: vm.id, pid: vm.spec.pid, vpkgEnergyJ: pkgSplit.vpkg };
      if (planes.length > 0) {
        const domains: VmDomainEnergy[] = [];
        for (let i = 0; i < planes.length; i++) {
          const { vpkg } = this.split(planes[i]!, vm, threads, es);
          const acc = vm.domainAcc[i]!;
          for (let g = 0; g < vm.nvpkg; g++) acc[g] = acc[g]! + vpkg[g]!;
          domains.push({ domain: this.planes[i]!.domain, vpkgEnergyJ: vpkg });
        }
        out.domains = domains;
      }
      vmsOut.push(out);
    }

    this.settleLent(pkgPlane);
    for (const p of planes) this.settleLent(p);
    const packages: PackageInterval[] = [];
    for (const pkg of this.packageIds) {
      const e = dE.get(pkg);
      const domains: DomainInterval[] = [];
      for (let i = 0; i < planes.length; i++) {
        const d = this.planes[i]!;
        const plane = planes[i]!;
        // A platform domain is reported under the package its one counter is read on.
        const key = d.platform ? (d.counters.has(pkg) ? PLATFORM_KEY : undefined) : pkg;
        const de = key === undefined ? undefined : plane.energy.get(key);
        if (de !== undefined) domains.push({ domain: d.domain, energyJ: de, attributedJ: plane.attributed.get(key!) ?? 0 });
      }
      // A package without its own energy this interval is left out, as before the other domains came.
      if (e === undefined) continue;
      const out: PackageInterval = { package: pkg, energyJ: e, attributedJ: pkgPlane.attributed.get(pkg) ?? 0 };
      if (domains.length > 0) out.domains = domains;
      packages.push(out);
    }
    return { tNs: s.tNs, dtS: dt, packages, vms: vmsOut, ended, problems };
  }

  /**
   * An idle VM's domains for the interval, every one 0: one array per count of virtual packages,
   * shared by every idle VM and interval (most VMs are idle most intervals), so readers must not modify it.
   */
  private idleDomains(nvpkg: number): VmDomainEnergy[] {
    let d = this.idle.get(nvpkg);
    if (d === undefined)
      this.idle.set(nvpkg, (d = this.planes.map((p) => ({ domain: p.domain, vpkgEnergyJ: new Array<number>(nvpkg).fill(0) }))));
    return d;
  }

  /** dE_{p,d} in joules where both samples have the domain's counter (a platform domain: under PLATFORM_KEY). */
  private domainEnergy(p: DomainPlane, before: Map<number, number>, now: Map<number, number>): Map<number, number> {
    const out = new Map<number, number>();
    for (const [pkg, c] of p.counters) {
      const a = before.get(pkg);
      const b = now.get(pkg);
      if (a === undefined || b === undefined) continue;
      out.set(p.platform ? PLATFORM_KEY : pkg, (b >= a ? b - a : b - a + Number(c.range)) * c.unitJ);
    }
    return out;
  }

  /**
   * How a domain's energy of the interval is paid: per package by its claims (payClaims), or, for a
   * platform domain, as one package holding every CPU and every claim.
   */
  private planeInterval(
    energy: Map<number, number>,
    platform: boolean,
    capacity: (pkg: number) => number,
    ticksOnPkg: Map<number, number>,
  ): PlaneInterval {
    // No thread of any VM seen on a package (every VM idle this interval, the usual case): no claim
    // to pay, so no pay structure; split() reads `pay` only for a thread on a package.
    if (ticksOnPkg.size === 0) return { energy, pay: NO_PAY, platform, attributed: new Map(), lent: 0 };
    const claims = platform
      ? [
          {
            package: PLATFORM_KEY,
            energyJ: energy.get(PLATFORM_KEY),
            capacity: this.packageIds.reduce((sum, pkg) => sum + capacity(pkg), 0),
            claimed: [...ticksOnPkg.values()].reduce((sum, t) => sum + t, 0),
          },
        ]
      : this.packageIds.map((pkg) => ({
          package: pkg,
          energyJ: energy.get(pkg),
          capacity: capacity(pkg),
          claimed: ticksOnPkg.get(pkg) ?? 0,
        }));
    const paid = payClaims(claims);
    const pay = new Map<number, PackagePay>();
    claims.forEach((c, i) => pay.set(c.package, paid[i]!));
    return { energy, pay, platform, attributed: new Map(), lent: 0 };
  }

  /**
   * One VM's energy of one domain over the interval, per virtual package: each thread's share e_k
   * (written to `es`), W (the non-vCPU threads' shares) spread evenly over the present vCPUs, and what
   * that gives each package's attributed total (the plane's `attributed` and `lent`).
   */
  private split(plane: PlaneInterval, vm: VmState, threads: readonly ThreadNow[], es: number[]): { vpkg: number[]; extra: number } {
    let w = 0;
    let nv = 0;
    for (let i = 0; i < threads.length; i++) {
      const t = threads[i]!;
      let e = 0;
      if (t.pkg !== undefined && t.dticks !== 0) {
        const key = plane.platform ? PLATFORM_KEY : t.pkg;
        const de = plane.energy.get(key);
        if (de !== undefined) e = (de * t.dticks) / plane.pay.get(key)!.divisor;
      }
      es[i] = e;
      if (t.vpkg === undefined) w += e;
      else nv++;
    }
    const vpkg = new Array<number>(vm.nvpkg).fill(0);
    if (nv === 0) return { vpkg, extra: 0 };
    const extra = w / nv;
    for (let i = 0; i < threads.length; i++) {
      const t = threads[i]!;
      const e = es[i]!;
      if (t.pkg !== undefined && e > 0) {
        const key = plane.platform ? PLATFORM_KEY : t.pkg;
        const p = plane.pay.get(key)!;
        plane.attributed.set(key, (plane.attributed.get(key) ?? 0) + (p.borrowedShare === 0 ? e : e * p.ownShare));
        plane.lent += e * p.borrowedShare;
      }
      if (t.vpkg !== undefined) vpkg[t.vpkg] = vpkg[t.vpkg]! + e + extra;
    }
    return { vpkg, extra };
  }

  /** Adds what each package lent to claims beyond another's capacity to its attributed energy. */
  private settleLent(plane: PlaneInterval): void {
    if (plane.lent <= 0) return;
    for (const [key, p] of plane.pay)
      if (p.lendShare > 0) plane.attributed.set(key, (plane.attributed.get(key) ?? 0) + plane.lent * p.lendShare);
  }

  /**
   * Whether the VM's lines in this sample are those of the previous one, every one understood and on
   * a known CPU: then the interval gives it nothing and reports nothing (what the full pass would
   * find), and the full pass is skipped. Idle VMs are most VMs, and the sampler hands an idle
   * thread's line back unchanged.
   */
  private unchanged(vm: VmState, s: Sample): boolean {
    const lines = s.tasks.get(vm.spec.pid);
    if (lines === undefined || lines.size !== vm.parsed.size || lines.size !== vm.prev.size) return false;
    for (const [tid, line] of lines) {
      const c = vm.parsed.get(tid);
      if (c === undefined || c.line !== line || c.stat === null || !this.cpuPackage.has(c.stat.processor)) return false;
    }
    return true;
  }

  /**
   * The VM's parsed threads in this sample, or null when the VM ended (pid absent, or its main
   * thread's starttime is not the registered one). Bad lines are reported and left out.
   */
  private aliveThreads(vm: VmState, s: Sample, problems: string[]): Map<number, ThreadStat> | null {
    const pid = vm.spec.pid;
    const lines = s.tasks.get(pid);
    if (lines === undefined) return null;
    const cache = vm.parsed;
    const out = new Map<number, ThreadStat>();
    for (const [tid, line] of lines) {
      let c = cache.get(tid);
      if (c === undefined || c.line !== line) {
        c = parseThread(pid, tid, line);
        cache.set(tid, c);
      }
      if (c.stat === null) problems.push(c.problem);
      else out.set(tid, c.stat);
    }
    if (cache.size > lines.size) for (const tid of cache.keys()) if (!lines.has(tid)) cache.delete(tid);
    // A missing or unreadable main-thread line cannot prove the pid was reused: the VM stays.
    const main = out.get(pid);
    if (main !== undefined && main.starttime !== vm.spec.starttime) return null;
    return out;
  }

  private end(vm: VmState, by: 'exit' | 'unregister' = 'exit'): void {
    vm.phase = 'ended';
    vm.endedBy = by;
    vm.prev = new Map();
    vm.parsed = new Map();
  }

  private publish(vm: VmState): VmOutput {
    const vpkgs: VpkgOutput[] = vm.acc.map((a, g) => ({
      vpkg: g,
      energyJ: a,
      energyUj: BigInt(Math.floor(a * 1e6)),
      counter: Math.floor(a / this.uGuest) % TWO_32,
    }));
    const out: VmOutput = { vmId: vm.id, pid: vm.spec.pid, ended: vm.phase === 'ended', tNs: vm.tNs, vpkgs };
    if (this.planes.length > 0)
      out.domains = this.planes.map((p, i) => ({
        domain: p.domain,
        vpkgEnergyJ: [...vm.domainAcc[i]!],
        vpkgEnergyUj: vm.domainAcc[i]!.map((a) => BigInt(Math.floor(a * 1e6))),
      }));
    if (vm.endedBy !== undefined) out.endedBy = vm.endedBy;
    if (vm.spec.name !== undefined) out.name = vm.spec.name;
    return out;
  }
}

/** A thread's stat line parsed for the rules (docs/ratio.md, "Reading a stat line"), or why it counts as absent. */
function parseThread(pid: number, tid: number, line: string): ParsedLine {
  const parsed = parseStatLine(line);
  if (!parsed.ok)
    return { line, stat: null, problem: `pid ${pid} tid ${tid}: stat line not understood (${parsed.error}): treated as absent` };
  const st = parsed.value;
  if (st.tid !== tid) return { line, stat: null, problem: `pid ${pid} tid ${tid}: stat line is for tid ${st.tid}: treated as absent` };
  return { line, stat: { starttime: st.starttime, ticks: st.utime + st.stime, processor: st.processor }, problem: '' };
}
