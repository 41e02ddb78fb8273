/** What a VM's statistics file holds (docs/stats-fd.md "A VM's file"), and the writing of one sample. Pure. */
import { STATS_BASE, STATS_TYPE, STATS_UNIT } from './flags.js';
import { planStatsLayout, type StatsDescriptor, type StatsLayout } from './layout.js';
import { COMMON_STATS, sampleTimeSlots, writeSampleTimes, type SampleTimes } from './common-stats.js';
import type { SampleBlock } from './sample-block.js';
import type { EnergyDomain, OtherDomain } from '../../model/domains.js';

export interface VmStatsShape {
  hostVmId: number;
  pid: number;
  name: string | null;
  nvpkg: number;
  nvcpu: number;
  /** Base-10 exponent of the clock-tick values; null (CLK_TCK not a power of ten): no tick descriptors, never a wrong unit. */
  tickExponent: number | null;
  /** The other RAPL domains the host reads (ENERGY_DOMAINS order), each with its values per virtual package. */
  domains: readonly OtherDomain[];
  /** The daemon runs --guest-energy exact: the guest_* values (docs/stats-fd.md "A VM's file"). */
  guest?: boolean;
  /** The daemon runs with power limits: the power_limit* values (docs/power-limits.md). */
  powerLimit?: boolean;
}

export function vmDomainNames(domain: OtherDomain): { energy: string; power: string; limit: string } {
  return { energy: `${domain}_energy`, power: `${domain}_power`, limit: `${domain}_power_limit` };
}

const one = (name: string, flags: number, exponent = 0): StatsDescriptor => ({ name, flags, exponent, size: 1 });
const C = STATS_TYPE.CUMULATIVE;
const I = STATS_TYPE.INSTANT;
const UJ = STATS_UNIT.JOULES | STATS_BASE.POW10;

function vmStatsDescriptors(s: VmStatsShape): StatsDescriptor[] {
  const out: StatsDescriptor[] = [
    ...COMMON_STATS,
    one('host_vm_id', I | STATS_UNIT.NONE),
    one('pid', I | STATS_UNIT.NONE),
    one('ended', I | STATS_UNIT.BOOLEAN),
    one('replaced', I | STATS_UNIT.BOOLEAN),
    { name: 'energy', flags: C | UJ, exponent: -6, size: s.nvpkg },
    { name: 'msr_energy_status', flags: I | STATS_UNIT.NONE, exponent: 0, size: s.nvpkg },
    { name: 'power', flags: I | STATS_UNIT.WATTS | STATS_BASE.POW10, exponent: -6, size: s.nvpkg },
    { name: 'vcpu_tid', flags: I | STATS_UNIT.NONE, exponent: 0, size: s.nvcpu },
    { name: 'vcpu_energy', flags: C | UJ, exponent: -6, size: s.nvcpu },
  ];
  if (s.tickExponent !== null) {
    const ticks = C | STATS_UNIT.SECONDS | STATS_BASE.POW10;
    out.push({ name: 'vcpu_cpu_time', flags: ticks, exponent: s.tickExponent, size: s.nvcpu });
    out.push(one('other_threads_cpu_time', ticks, s.tickExponent));
  }
  // Added after the others, only on a host that reads the domain (a reader finds values by name).
  for (const d of s.domains) {
    const n = vmDomainNames(d);
    out.push({ name: n.energy, flags: C | UJ, exponent: -6, size: s.nvpkg });
    out.push({ name: n.power, flags: I | STATS_UNIT.WATTS | STATS_BASE.POW10, exponent: -6, size: s.nvpkg });
  }
  if (s.guest === true) {
    out.push(one('guest_energy', C | UJ, -6));
    out.push(one('guest_exact_energy', C | UJ, -6));
    out.push(one('guest_garbage_windows', C | STATS_UNIT.NONE));
    out.push(one('guest_garbage_energy', C | UJ, -6));
  }
  if (s.powerLimit === true) {
    out.push(one('power_limit', I | STATS_UNIT.WATTS | STATS_BASE.POW10, -3));
    out.push(one('power_limit_cpu_quota', I | STATS_UNIT.NONE, -3));
    out.push(one('power_limited_time', C | STATS_UNIT.SECONDS | STATS_BASE.POW10, -3));
    for (const d of s.domains) out.push(one(vmDomainNames(d).limit, I | STATS_UNIT.WATTS | STATS_BASE.POW10, -3));
  }
  return out;
}

/** The id string (cut to the name size by the encoder): "vmsr-vm-<host VM id>/pid-<pid>[/<name>]". */
export function vmStatsLayout(s: VmStatsShape): StatsLayout {
  return planStatsLayout(`vmsr-vm-${s.hostVmId}/pid-${s.pid}${s.name !== null ? `/${s.name}` : ''}`, vmStatsDescriptors(s));
}

/** One vCPU's totals since the VM's baseline. */
export interface VcpuTotals {
  tid: number;
  energyUj: number;
  ticks: number;
}

export interface VmStatsValues extends SampleTimes {
  ended: boolean;
  /** Per virtual package: cumulative µJ (an integer), the MSR-format counter, power over the last interval (µW). */
  energyUj: readonly number[];
  counter: readonly number[];
  powerUw: readonly number[];
  /** Per vCPU, in the order of the VM's vCPU list. */
  vcpus: readonly VcpuTotals[];
  /** Ticks of the VM's threads that are not vCPUs. */
  otherTicks: number;
  domains?: readonly { domain: OtherDomain; energyUj: readonly number[]; powerUw: readonly number[] }[];
  /** Exact mode: µJ QEMU was given to credit the guest, and µJ attributed over the same windows. */
  guest?: { guestUj: number; exactUj: number; garbageWindows: number; garbageUj: number };
  /** Power limits: each domain's limit (mW, none: 0), the quota in force (thousandths of a CPU, 0 = none), ms limited. */
  powerLimit?: { limitsMw: ReadonlyMap<EnergyDomain, number>; quotaMilliCpus: number; limitedMs: number };
}

export type VmStatsSlots = ReturnType<typeof vmStatsSlots>;

/** Word indexes of a VM file's values; null where the file has no such descriptor. */
export function vmStatsSlots(b: SampleBlock, shape: VmStatsShape) {
  const opt = (name: string): number | null => (b.has(name) ? b.slot(name) : null);
  const powerLimit = opt('power_limit');
  return {
    shape,
    times: sampleTimeSlots(b),
    hostVmId: b.slot('host_vm_id'),
    pid: b.slot('pid'),
    ended: b.slot('ended'),
    replaced: b.slot('replaced'),
    energy: b.slot('energy'),
    counter: b.slot('msr_energy_status'),
    power: b.slot('power'),
    vcpuTid: b.slot('vcpu_tid'),
    vcpuEnergy: b.slot('vcpu_energy'),
    vcpuTicks: opt('vcpu_cpu_time'),
    otherTicks: opt('other_threads_cpu_time'),
    domains: new Map(shape.domains.map((d) => [d, { energy: b.slot(vmDomainNames(d).energy), power: b.slot(vmDomainNames(d).power) }])),
    guestEnergy: opt('guest_energy'),
    guestExact: opt('guest_exact_energy'),
    /** The word index of power_limit; power_limit_cpu_quota and power_limited_time follow it. */
    powerLimit,
    domainLimits: new Map(powerLimit === null ? [] : shape.domains.map((d) => [d, b.slot(vmDomainNames(d).limit)])),
    guestGarbage: opt('guest_garbage_windows'),
    guestGarbageUj: opt('guest_garbage_energy'),
  };
}

/** One sample's values into the block (inside SampleBlock.write). Arrays longer than the file's are cut, shorter ones leave 0. */
export function writeVmStats(b: SampleBlock, slots: VmStatsSlots, v: VmStatsValues): void {
  writeVmInterval(b, slots, v);
  b.setNumber(slots.hostVmId, slots.shape.hostVmId);
  b.setNumber(slots.pid, slots.shape.pid);
  b.setNumber(slots.ended, v.ended ? 1 : 0);
  const np = Math.min(slots.shape.nvpkg, v.energyUj.length);
  for (let g = 0; g < np; g++) {
    b.setNumber(slots.energy + g, v.energyUj[g]!);
    b.setNumber(slots.counter + g, v.counter[g] ?? 0);
  }
  const nc = Math.min(slots.shape.nvcpu, v.vcpus.length);
  for (let i = 0; i < nc; i++) {
    const c = v.vcpus[i]!;
    b.setNumber(slots.vcpuTid + i, c.tid);
    b.setNumber(slots.vcpuEnergy + i, c.energyUj);
    if (slots.vcpuTicks !== null) b.setNumber(slots.vcpuTicks + i, c.ticks);
  }
  if (slots.otherTicks !== null) b.setNumber(slots.otherTicks, v.otherTicks);
  for (const d of v.domains ?? []) {
    const at = slots.domains.get(d.domain);
    if (!at) continue;
    const n = Math.min(slots.shape.nvpkg, d.energyUj.length);
    for (let g = 0; g < n; g++) b.setNumber(at.energy + g, d.energyUj[g]!);
  }
  if (v.guest !== undefined && slots.guestEnergy !== null && slots.guestExact !== null) {
    b.setNumber(slots.guestEnergy, Math.floor(v.guest.guestUj));
    b.setNumber(slots.guestExact, Math.floor(v.guest.exactUj));
    if (slots.guestGarbage !== null) b.setNumber(slots.guestGarbage, v.guest.garbageWindows);
    if (slots.guestGarbageUj !== null) b.setNumber(slots.guestGarbageUj, Math.floor(v.guest.garbageUj));
  }
}

/** The part of writeVmStats that moves at every sample even when the VM's totals did not (an idle interval). */
export function writeVmInterval(b: SampleBlock, slots: VmStatsSlots, v: VmStatsValues): void {
  writeSampleTimes(b, v, slots.times);
  const np = Math.min(slots.shape.nvpkg, v.energyUj.length);
  for (let g = 0; g < np; g++) b.setNumber(slots.power + g, v.powerUw[g] ?? 0);
  for (const d of v.domains ?? []) {
    const at = slots.domains.get(d.domain);
    if (!at) continue;
    const n = Math.min(slots.shape.nvpkg, d.energyUj.length);
    for (let g = 0; g < n; g++) b.setNumber(at.power + g, d.powerUw[g] ?? 0);
  }
  if (slots.powerLimit !== null) {
    const p = v.powerLimit ?? { limitsMw: new Map<EnergyDomain, number>(), quotaMilliCpus: 0, limitedMs: 0 };
    b.setNumber(slots.powerLimit, p.limitsMw.get('package') ?? 0);
    for (const [d, at] of slots.domainLimits) b.setNumber(at, p.limitsMw.get(d) ?? 0);
    b.setNumber(slots.powerLimit + 1, p.quotaMilliCpus);
    b.setNumber(slots.powerLimit + 2, p.limitedMs);
  }
}

/** The base-10 exponent of one clock tick in seconds (-2 for 100), or null when CLK_TCK is not a power of ten. */
export function tickExponent(clkTck: number): number | null {
  const e = Math.round(Math.log10(clkTck));
  return e >= 0 && 10 ** e === clkTck ? -e : null;
}
