/** The ratio engine, pure: splits package energy across the threads of registered VMs as docs/ratio.md ("ticks" mode) says, in float64. */
import { counterOfJoules, joulesPerCounterUnit, packageCounter } from './counter.js';
import { fitLength } from '../common/fit-length.js';
import type { VcpuSpec } from '../model/vcpus.js';
import {
  aliveThreads,
  checkedVcpus,
  endVm,
  fillThreadTotals,
  newEngineVm,
  nvpkgOf,
  vmFromState,
  vmState,
  type EngineVm,
} from './engine-vm.js';
import { engineStateProblem, type EngineState, type ThreadMark } from './engine-state.js';
import { PLATFORM_DOMAINS, type OtherDomain } from '../model/domains.js';
import {
  closeCounters,
  counterSlot,
  newPlane,
  payPlane,
  settleLent,
  split,
  type CounterSlot,
  type Plane,
  type ThreadNow,
} from './plane.js';
import { domainCounterProblem } from './domain-counters.js';
import type { DomainCounter, HostInfo, CounterSpec } from '../model/host.js';
import {
  microjoules,
  type DomainInterval,
  type IntervalResult,
  type PackageInterval,
  type VmInterval,
  type VmOutput,
  type VmDomainEnergy,
  type VmTotals,
  type VpkgOutput,
} from './outputs.js';
import type { Sample } from '../model/sample.js';
import type { VmSpec } from '../model/vm.js';

export class RatioEngine {
  /** MSR_RAPL_POWER_UNIT of host package 0 (or of the lowest-numbered package when there is no 0). */
  readonly guestPowerUnit: bigint;
  private readonly uGuest: number;
  private readonly clkTck: number;
  /** Package ids, ascending: a package's index here is its slot in every plane (pkgIndex). */
  private readonly packageIds: number[];
  private readonly pkgIndex = new Map<number, number>();
  /** cpu -> its package's index. */
  private readonly cpuSlot = new Map<number, number>();
  /** n_p: online CPUs per package (by index). */
  private readonly cpusPerPackage: number[];
  private readonly vms = new Map<number, EngineVm>();
  private nextId = 1;
  private prevT: bigint | undefined;
  private readonly pkgPlane: Plane<'package'>;
  /** The other domains the host reads, in ENERGY_DOMAINS order. */
  private readonly planes: Plane<OtherDomain>[] = [];
  private readonly allPlanes: Plane[];
  private readonly planeOf = new Map<string, number>();
  /** D_p of the interval per package index (reused). */
  private readonly claimed: number[];
  /** Per count of virtual packages: an idle VM's domains, all 0 (shared, read only). */
  private readonly idle = new Map<number, VmDomainEnergy[]>();
  /** Problems found in the last addSample, also when it returned null (the first sample). */
  lastProblems: string[] = [];

  constructor(host: HostInfo) {
    if (!Number.isFinite(host.clkTck) || host.clkTck <= 0) throw new Error(`CLK_TCK must be a positive number, got ${host.clkTck}`);
    if (host.packages.length === 0) throw new Error('the host has no packages');
    this.clkTck = host.clkTck;
    const counters = new Map<number, CounterSpec>();
    for (const p of host.packages) {
      if (counters.has(p.pkg)) throw new Error(`package ${p.pkg} is listed twice`);
      counters.set(p.pkg, packageCounter(p));
    }
    this.packageIds = [...counters.keys()].sort((a, b) => a - b);
    this.packageIds.forEach((pkg, i) => this.pkgIndex.set(pkg, i));
    this.cpusPerPackage = this.packageIds.map(() => 0);
    this.claimed = this.packageIds.map(() => 0);
    for (const c of host.cpus) {
      if (this.cpuSlot.has(c.cpu)) throw new Error(`cpu ${c.cpu} is listed twice`);
      const i = this.pkgIndex.get(c.pkg);
      if (i === undefined) throw new Error(`cpu ${c.cpu} is in package ${c.pkg}, which is not among the host's packages`);
      this.cpuSlot.set(c.cpu, i);
      this.cpusPerPackage[i]!++;
    }
    this.pkgPlane = newPlane('package', this.packageIds.length);
    this.packageIds.forEach((pkg, i) => (this.pkgPlane.counters[i] = counterSlot(pkg, counters.get(pkg)!)));
    const domains = host.domains ?? [];
    domains.forEach((d, i) => this.addDomainCounter(d, domains.slice(0, i)));
    this.allPlanes = [this.pkgPlane, ...this.planes];
    const guest = host.packages.find((p) => p.pkg === 0) ?? host.packages.find((p) => p.pkg === this.packageIds[0]);
    this.guestPowerUnit = guest!.powerUnit;
    this.uGuest = joulesPerCounterUnit(this.guestPowerUnit);
  }

  private addDomainCounter(d: DomainCounter, before: readonly DomainCounter[]): void {
    const problem = domainCounterProblem(d, this.pkgIndex, before);
    if (problem !== undefined) throw new Error(problem);
    let i = this.planeOf.get(d.domain);
    if (i === undefined) {
      this.planeOf.set(d.domain, (i = this.planes.length));
      this.planes.push(newPlane(d.domain, PLATFORM_DOMAINS.has(d.domain) ? 1 : this.packageIds.length));
    }
    const plane = this.planes[i]!;
    plane.counters[plane.platform ? 0 : this.pkgIndex.get(d.pkg)!] = counterSlot(d.pkg, d);
  }

  /** The counter of an other domain read on `pkg`, or undefined when the host does not read it. */
  private counterOf(domain: string, pkg: number): CounterSlot | undefined {
    const i = this.planeOf.get(domain);
    if (i === undefined) return undefined;
    const plane = this.planes[i]!;
    const k = plane.platform ? 0 : this.pkgIndex.get(pkg);
    const c = k === undefined ? undefined : plane.counters[k];
    return c?.pkg === pkg ? c : undefined;
  }

  domains(): OtherDomain[] {
    return this.planes.map((p) => p.domain);
  }

  register(vm: VmSpec): number {
    const id = this.nextId++;
    this.vms.set(id, newEngineVm(id, vm, this.planes.length));
    return id;
  }

  /** A VM's new vCPU list from the next sample on (hotplug, a client taking over a discovered VM): totals kept, nvpkg only grows. */
  updateVcpus(vmId: number, vcpus: readonly VcpuSpec[]): void {
    const vm = this.vms.get(vmId);
    if (!vm) throw new Error(`no VM ${vmId}`);
    const vcpuVpkg = checkedVcpus(vcpus);
    const nvpkg = nvpkgOf(vcpuVpkg, vm.nvpkg);
    vm.vcpuVpkg = vcpuVpkg;
    vm.changes++;
    vm.spec = { ...vm.spec, vcpus: vcpus.map((v) => ({ ...v })) };
    while (vm.acc.length < nvpkg) vm.acc.push(0);
    for (const a of vm.domainAcc) while (a.length < nvpkg) a.push(0);
    vm.nvpkg = nvpkg;
  }

  unregister(vmId: number): void {
    const vm = this.vms.get(vmId);
    if (vm && vm.phase !== 'ended') endVm(vm, 'unregister');
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

  /** output(vmId)?.ended ?? true, without building the output. */
  ended(vmId: number): boolean {
    return (this.vms.get(vmId)?.phase ?? 'ended') === 'ended';
  }

  outputs(): VmOutput[] {
    return [...this.vms.values()].map((vm) => this.publish(vm));
  }

  /** A VM's totals since its baseline per vCPU (list order; one not yet seen: 0), and the other threads' ticks summed. */
  threadTotals(vmId: number) {
    const vm = this.vms.get(vmId);
    if (!vm) return undefined;
    const vcpus = vm.spec.vcpus.map((v) => ({ tid: v.tid, vpkg: v.vpkg, energyJ: 0, ticks: 0 }));
    return { vcpus, otherTicks: fillThreadTotals(vm, vcpus) };
  }

  /** A VM's totals into `into` in place (no allocation once its arrays fit; only `tNs` after an idle interval); false: no such VM. */
  totalsInto(vmId: number, into: VmTotals): boolean {
    const vm = this.vms.get(vmId);
    if (!vm) return false;
    into.tNs = vm.tNs;
    if (into.vmId === vmId && into.changes === vm.changes) return true;
    into.vmId = vmId;
    into.changes = vm.changes;
    into.ended = vm.phase === 'ended';
    const n = vm.acc.length;
    fitLength(into.energyUj, n);
    fitLength(into.counter, n);
    for (let g = 0; g < n; g++) {
      into.energyUj[g] = microjoules(vm.acc[g]!);
      into.counter[g] = counterOfJoules(vm.acc[g]!, this.uGuest);
    }
    fitLength(into.domains, this.planes.length);
    for (let i = 0; i < this.planes.length; i++) {
      const d = (into.domains[i] ??= { domain: this.planes[i]!.domain, energyUj: [] });
      const acc = vm.domainAcc[i]!;
      d.domain = this.planes[i]!.domain;
      fitLength(d.energyUj, acc.length);
      for (let g = 0; g < acc.length; g++) d.energyUj[g] = microjoules(acc[g]!);
    }
    const spec = vm.spec.vcpus;
    fitLength(into.vcpus, spec.length);
    for (let i = 0; i < spec.length; i++) (into.vcpus[i] ??= { tid: 0, energyJ: 0, ticks: 0 }).tid = spec[i]!.tid;
    into.otherTicks = fillThreadTotals(vm, into.vcpus);
    return true;
  }

  /** Samples are missing (a trace's gap): the next sample is a new baseline, as a first sample is. */
  gap(): void {
    this.prevT = undefined;
    for (const p of this.allPlanes) for (const c of p.counters) if (c !== undefined) c.last = NaN;
    for (const vm of this.vms.values()) if (vm.phase === 'active') vm.phase = 'pending';
  }

  /** The whole state as plain data (copies), for restore() on a new engine of the same host. */
  state(): EngineState {
    const vms = [...this.vms.values()].map((vm) => vmState(vm, this.domains()));
    let lastSample: EngineState['lastSample'] = null;
    if (this.prevT !== undefined) {
      const kept = (p: Plane) => p.counters.filter((c): c is CounterSlot => c !== undefined && !Number.isNaN(c.last));
      lastSample = { tNs: this.prevT, energy: kept(this.pkgPlane).map((c) => ({ pkg: c.pkg, raw: c.last })) };
      const domains = this.planes.flatMap((p) => kept(p).map((c) => ({ domain: p.domain, pkg: c.pkg, raw: c.last })));
      if (domains.length > 0) lastSample.domains = domains;
    }
    return { nextId: this.nextId, lastSample, vms };
  }

  /** Takes back what state() gave, on a new engine, as if it had never stopped; throws naming the first bad value, changing nothing. */
  restore(s: EngineState): void {
    if (this.vms.size > 0 || this.prevT !== undefined || this.nextId !== 1)
      throw new Error('only an engine with no VM and no sample can be restored');
    const problem = engineStateProblem(s, (domain, pkg) =>
      domain === 'package' ? this.pkgPlane.counters[this.pkgIndex.get(pkg) ?? -1]?.range : this.counterOf(domain, pkg)?.range,
    );
    if (problem !== null) throw new Error(problem);
    for (const v of s.vms) this.vms.set(v.id, vmFromState(v, this.domains()));
    this.nextId = s.nextId;
    if (s.lastSample !== null) {
      this.prevT = s.lastSample.tNs;
      for (const e of s.lastSample.energy) this.pkgPlane.counters[this.pkgIndex.get(e.pkg)!]!.last = e.raw;
      for (const d of s.lastSample.domains ?? []) {
        const c = this.counterOf(d.domain, d.pkg);
        if (c !== undefined) c.last = d.raw;
      }
    }
  }

  addSample(s: Sample): IntervalResult | null {
    // Validate before touching any state, so a rejected sample leaves the engine as it was.
    if (this.prevT !== undefined && s.tNs <= this.prevT) {
      throw new Error(`sample time ${s.tNs} ns is not after the previous sample (${this.prevT} ns)`);
    }
    const problems: string[] = [];
    this.readCounters(s, problems);
    const prevT = this.prevT;
    this.prevT = s.tNs;

    let result: IntervalResult | null = null;
    const ended: number[] = [];
    if (prevT !== undefined) {
      for (const p of this.allPlanes) closeCounters(p);
      result = this.interval(s, prevT, problems, ended);
    }
    // The next interval starts here; a missing domain value keeps the last (the next spans the gap), a missing package value: a baseline.
    for (const p of this.allPlanes)
      for (const c of p.counters) if (c !== undefined && (!p.keepsLast || !Number.isNaN(c.now))) c.last = c.now;
    // VMs registered since the previous sample take this one as their baseline.
    for (const vm of this.vms.values()) {
      if (vm.phase !== 'pending') continue;
      const threads = aliveThreads(vm, s, problems);
      if (threads === null) {
        endVm(vm);
        ended.push(vm.id);
        continue;
      }
      vm.phase = 'active';
      vm.prev = new Map(threads);
    }
    if (result) {
      result.ended = ended;
      result.problems = problems;
    }
    this.lastProblems = problems;
    return result;
  }

  /** Each counter's `now` (NaN where the sample lacks it); values the host does not read are reported and left out. */
  private readCounters(s: Sample, problems: string[]): void {
    for (const p of this.allPlanes) for (const c of p.counters) if (c !== undefined) c.now = NaN;
    const pkgs = this.pkgPlane.counters;
    for (const [pkg, raw] of s.energy) {
      const k = this.pkgIndex.get(pkg);
      if (k === undefined) {
        problems.push(`energy given for package ${pkg}, which the host does not have: ignored`);
        continue;
      }
      const c = pkgs[k]!;
      c.now = Number(raw % c.range);
    }
    for (const c of pkgs) if (Number.isNaN(c!.now)) problems.push(`no energy value for package ${c!.pkg} in this sample`);
    for (const r of s.domains ?? []) {
      const c = this.counterOf(r.domain, r.pkg);
      if (c === undefined) {
        problems.push(`${String(r.domain)} energy given for package ${r.pkg}, which the host does not read: ignored`);
        continue;
      }
      c.now = Number(r.raw % c.range);
    }
    for (const p of this.planes)
      for (const c of p.counters)
        if (c !== undefined && Number.isNaN(c.now)) problems.push(`no ${p.domain} energy value for package ${c.pkg} in this sample`);
  }

  private interval(s: Sample, prevT: bigint, problems: string[], ended: number[]): IntervalResult {
    const dt = Number(s.tNs - prevT) / 1e9;
    const { live, anyClaim } = this.claim(s, problems, ended);

    // e_k = dE_p * dticks / cap_p, ticks beyond cap_p paid as overclaim.ts says; every other domain alike with its own
    // energy (docs/ratio.md "Other RAPL domains"). No thread seen on any package (every VM idle, the usual case): nothing to pay.
    const capacity = anyClaim ? this.cpusPerPackage.map((n) => this.clkTck * dt * n) : null;
    for (const p of this.allPlanes) payPlane(p, this.packageIds, capacity, this.claimed);

    const vmsOut: VmInterval[] = [];
    for (const { vm, threads } of live) {
      vm.tNs = s.tNs;
      vmsOut.push(threads === null ? this.idleVmInterval(vm) : this.vmInterval(vm, threads));
    }
    for (const p of this.allPlanes) settleLent(p);
    return { tNs: s.tNs, dtS: dt, packages: this.packageIntervals(), vms: vmsOut, ended, problems };
  }

  /** Pass 1: the VMs still alive (threads null: idle), each thread's dticks and package, D_p (`this.claimed`). */
  private claim(s: Sample, problems: string[], ended: number[]) {
    const live: { vm: EngineVm; threads: ThreadNow[] | null }[] = [];
    const claimed = this.claimed.fill(0);
    let anyClaim = false;
    for (const vm of this.vms.values()) {
      if (vm.phase !== 'active') continue;
      if (this.unchanged(vm, s)) {
        // Every line as in the previous sample: every dticks is 0, nothing to attribute, the marks stay.
        live.push({ vm, threads: null });
        continue;
      }
      const now = aliveThreads(vm, s, problems);
      if (now === null) {
        endVm(vm);
        ended.push(vm.id);
        continue;
      }
      const threads: ThreadNow[] = [];
      const marks = new Map<number, ThreadMark>();
      for (const [tid, st] of now) {
        const before = vm.prev.get(tid);
        const dticks = Math.max(0, before !== undefined && before.starttime === st.starttime ? st.ticks - before.ticks : st.ticks);
        const pk = this.cpuSlot.get(st.processor) ?? -1;
        if (pk < 0) {
          problems.push(
            `pid ${vm.spec.pid} tid ${tid}: ran on cpu ${st.processor}, which the host map does not have: no energy for it this interval`,
          );
        } else {
          claimed[pk] = claimed[pk]! + dticks;
          anyClaim = true;
        }
        threads.push({ tid, dticks, pk, vpkg: vm.vcpuVpkg.get(tid) });
        marks.set(tid, st);
      }
      vm.prev = marks;
      live.push({ vm, threads });
    }
    return { live, anyClaim };
  }

  /** Its domains shared by every idle VM and interval (most VMs are idle most intervals): readers must not modify them. */
  private idleVmInterval({ id, spec, nvpkg }: EngineVm): VmInterval {
    const out: VmInterval = { vmId: id, pid: spec.pid, vpkgEnergyJ: new Array<number>(nvpkg).fill(0) };
    if (this.planes.length === 0) return out;
    let d = this.idle.get(nvpkg);
    if (d === undefined)
      this.idle.set(nvpkg, (d = this.planes.map((p) => ({ domain: p.domain, vpkgEnergyJ: new Array<number>(nvpkg).fill(0) }))));
    out.domains = d;
    return out;
  }

  /** Pass 2 for one VM: its threads' shares of each plane's paid energy, per virtual package, added to its totals. */
  private vmInterval(vm: EngineVm, threads: ThreadNow[]): VmInterval {
    const es: number[] = new Array<number>(threads.length);
    const pkgSplit = split(this.pkgPlane, vm.nvpkg, threads, es);
    // A line may change with no tick and no energy (a thread moved to another CPU): its totals did not.
    let moved = pkgSplit.extra !== 0 || threads.some((th, i) => th.dticks !== 0 || es[i] !== 0);
    const totals = (vm.threads ??= new Map());
    for (let i = 0; i < threads.length; i++) {
      const th = threads[i]!;
      if (th.dticks === 0 && th.vpkg === undefined) continue;
      let k = totals.get(th.tid);
      if (k === undefined) totals.set(th.tid, (k = { energyJ: 0, ticks: 0 }));
      k.ticks += th.dticks;
      if (th.vpkg !== undefined) k.energyJ += es[i]! + pkgSplit.extra;
    }
    // With no vCPU present, W is dropped and nothing is attributed on any package.
    for (let g = 0; g < vm.nvpkg; g++) {
      vm.acc[g] = vm.acc[g]! + pkgSplit.vpkg[g]!;
      moved ||= pkgSplit.vpkg[g] !== 0;
    }
    const out: VmInterval = { vmId: vm.id, pid: vm.spec.pid, vpkgEnergyJ: pkgSplit.vpkg };
    if (this.planes.length > 0)
      out.domains = this.planes.map((plane, i) => {
        const { vpkg } = split(plane, vm.nvpkg, threads, es);
        const acc = vm.domainAcc[i]!;
        for (let g = 0; g < vm.nvpkg; g++) {
          acc[g] = acc[g]! + vpkg[g]!;
          moved ||= vpkg[g] !== 0;
        }
        return { domain: plane.domain, vpkgEnergyJ: vpkg };
      });
    if (moved) vm.changes++;
    return out;
  }

  private packageIntervals(): PackageInterval[] {
    const packages: PackageInterval[] = [];
    const pkgEnergy = this.pkgPlane.energy;
    for (let k = 0; k < this.packageIds.length; k++) {
      // A package without its own energy this interval is left out, as before the other domains came.
      const e = pkgEnergy[k]!;
      if (Number.isNaN(e)) continue;
      const pkg = this.packageIds[k]!;
      const out: PackageInterval = { pkg, energyJ: e, attributedJ: this.pkgPlane.attributed[k]! };
      const domains: DomainInterval[] = [];
      for (const d of this.planes) {
        // A platform domain is reported under the package its one counter is read on.
        const slot = d.platform ? 0 : k;
        const de = d.energy[slot]!;
        if (d.counters[slot]?.pkg === pkg && !Number.isNaN(de))
          domains.push({ domain: d.domain, energyJ: de, attributedJ: d.attributed[slot]! });
      }
      if (domains.length > 0) out.domains = domains;
      packages.push(out);
    }
    return packages;
  }

  /** Whether the VM's lines are the previous sample's, each understood and on a known CPU: the full pass would do nothing. */
  private unchanged(vm: EngineVm, s: Sample): boolean {
    const lines = s.tasks.get(vm.spec.pid);
    if (lines === undefined || lines.size !== vm.parsed.size || lines.size !== vm.prev.size) return false;
    for (const [tid, line] of lines) {
      const c = vm.parsed.get(tid);
      if (c === undefined || c.line !== line || c.stat === null || !this.cpuSlot.has(c.stat.processor)) return false;
    }
    return true;
  }

  private publish(vm: EngineVm): VmOutput {
    const vpkgs: VpkgOutput[] = vm.acc.map((a, g) => ({
      vpkg: g,
      energyJ: a,
      energyUj: BigInt(microjoules(a)),
      counter: counterOfJoules(a, this.uGuest),
    }));
    const out: VmOutput = { vmId: vm.id, pid: vm.spec.pid, ended: vm.phase === 'ended', tNs: vm.tNs, vpkgs };
    if (this.planes.length > 0)
      out.domains = this.planes.map((p, i) => ({
        domain: p.domain,
        vpkgEnergyJ: [...vm.domainAcc[i]!],
        vpkgEnergyUj: vm.domainAcc[i]!.map((a) => BigInt(microjoules(a))),
      }));
    if (vm.endedBy !== undefined) out.endedBy = vm.endedBy;
    if (vm.spec.name !== undefined) out.name = vm.spec.name;
    return out;
  }
}
