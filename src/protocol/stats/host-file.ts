/** What the host's statistics file holds (docs/stats-fd.md "The host's file"). Pure. */
import { STATS_BASE, STATS_TYPE, STATS_UNIT } from './flags.js';
import { planStatsLayout, type StatsDescriptor, type StatsLayout } from './layout.js';
import { COMMON_STATS, writeSampleTimes, type SampleTimes } from './common-stats.js';
import type { SampleBlock } from './sample-block.js';
import type { DaemonCounters } from '../v2/codec.js';
import { ENERGY_DOMAINS, type OtherDomain } from '../../model/domains.js';

const C = STATS_TYPE.CUMULATIVE;
const I = STATS_TYPE.INSTANT;
const UJ = STATS_UNIT.JOULES | STATS_BASE.POW10;
const one = (name: string, flags: number, exponent = 0): StatsDescriptor => ({ name, flags, exponent, size: 1 });

/** Counters of the host file, in file order: name, type and value. */
const COUNTERS = [
  ['samples', C, 'samples'],
  ['sample_failures', C, 'sampleFailures'],
  ['legacy_ok', C, 'legacyOk'],
  ['legacy_refused', C, 'legacyRefused'],
  ['legacy_failed', C, 'legacyFailed'],
  ['vm_changes', C, 'vmChanges'],
  ['connections', I, 'connections'],
  ['vms', I, 'vms'],
] as const;

/** The daemon's VM caps and fd budget, and how much is taken; null where it has none (its descriptors left out). */
export interface HostCapacity {
  registered: { used: number; max: number };
  discovered: { used: number; max: number } | null;
  fds: { open: number; max: number; available: number } | null;
}

export function hostDomainNames(domain: OtherDomain): { packageId: string; energy: string; unattributed: string } {
  return { packageId: `${domain}_package_id`, energy: `${domain}_energy`, unattributed: `${domain}_unattributed_energy` };
}

/** One other domain the host reads: the packages it is read on (psys: one, the lowest). */
export interface HostDomainShape {
  domain: OtherDomain;
  packages: readonly number[];
}

/** Groups (package, domain) pairs by domain, in ENERGY_DOMAINS order, packages in the order given. */
export function hostDomainShapes(pairs: readonly { pkg: number; domain: OtherDomain }[]): HostDomainShape[] {
  const out: HostDomainShape[] = [];
  for (const domain of ENERGY_DOMAINS) {
    const packages = pairs.filter((p) => p.domain === domain).map((p) => p.pkg);
    if (domain !== 'package' && packages.length > 0) out.push({ domain, packages });
  }
  return out;
}

/** `capacity`: which parts of HostCapacity the file holds. */
export function hostStatsLayout(
  daemonPid: number,
  npkg: number,
  shape: { capacity?: { discovered: boolean; fds: boolean }; domains?: readonly HostDomainShape[] } = {},
): StatsLayout {
  const plain = (name: string) => one(name, I | STATS_UNIT.NONE);
  const descs: StatsDescriptor[] = [
    ...COMMON_STATS,
    { name: 'package_id', flags: I | STATS_UNIT.NONE, exponent: 0, size: npkg },
    { name: 'package_energy', flags: C | UJ, exponent: -6, size: npkg },
    { name: 'package_unattributed_energy', flags: C | UJ, exponent: -6, size: npkg },
    one('unattributed_energy', C | UJ, -6),
    one('last_sample_duration', I | STATS_UNIT.SECONDS | STATS_BASE.POW10, -9),
    ...COUNTERS.map(([name, type]) => one(name, type | STATS_UNIT.NONE)),
    // Added after the others, in the order they came: a reader finds values by name and skips what it does not know.
    ...['energy_source', 'vms_registered', 'vms_registered_max'].map(plain),
    ...(shape.capacity?.discovered ? ['vms_discovered', 'vms_discovered_max'].map(plain) : []),
    ...(shape.capacity?.fds ? ['fds_open', 'fds_max', 'fds_available'].map(plain) : []),
    ...(shape.domains ?? []).flatMap((d) => {
      const n = hostDomainNames(d.domain);
      const size = d.packages.length;
      return [
        { name: n.packageId, flags: I | STATS_UNIT.NONE, exponent: 0, size },
        { name: n.energy, flags: C | UJ, exponent: -6, size },
        { name: n.unattributed, flags: C | UJ, exponent: -6, size },
      ];
    }),
  ];
  return planStatsLayout(`vmsr-host/pid-${daemonPid}`, descs);
}

export interface HostStatsValues extends SampleTimes, DaemonCounters {
  packages: readonly { pkg: number; energyUj: bigint; unattributedUj: bigint }[];
  unattributedUj: bigint;
  /** Samples with HOST_UPDATE's VMS_CHANGED, counted. */
  vmChanges: bigint;
  /** Which energy source the daemon reads, as a code (energy/kinds.ts ENERGY_SOURCE_CODE); 0: not stated. */
  energySource: number;
  /** Parts the file has no descriptor for are not written. */
  capacity?: HostCapacity;
  domains?: readonly { pkg: number; domain: OtherDomain; energyUj: bigint; unattributedUj: bigint }[];
}

/** One sample's values; `domains`: the shapes the file was laid out with. */
export function writeHostStats(b: SampleBlock, v: HostStatsValues, domains: readonly HostDomainShape[] = []): void {
  writeSampleTimes(b, v);
  const id = b.slot('package_id');
  const e = b.slot('package_energy');
  const u = b.slot('package_unattributed_energy');
  v.packages.forEach((p, i) => {
    b.setNumber(id + i, p.pkg);
    b.setBig(e + i, p.energyUj);
    b.setBig(u + i, p.unattributedUj);
  });
  b.setBig(b.slot('unattributed_energy'), v.unattributedUj);
  b.setBig(b.slot('last_sample_duration'), v.lastSampleDurationNs);
  for (const [name, , key] of COUNTERS) {
    const x = v[key];
    if (typeof x === 'bigint') b.setBig(b.slot(name), x);
    else b.setNumber(b.slot(name), x);
  }
  b.setNumber(b.slot('energy_source'), v.energySource);
  for (const shape of domains) {
    const n = hostDomainNames(shape.domain);
    const ids = b.slot(n.packageId);
    shape.packages.forEach((pkg, i) => b.setNumber(ids + i, pkg));
    for (const d of v.domains ?? []) {
      const i = d.domain === shape.domain ? shape.packages.indexOf(d.pkg) : -1;
      if (i < 0) continue;
      b.setBig(b.slot(n.energy) + i, d.energyUj);
      b.setBig(b.slot(n.unattributed) + i, d.unattributedUj);
    }
  }
  if (v.capacity) writeCapacity(b, v.capacity);
}

function writeCapacity(b: SampleBlock, c: HostCapacity): void {
  const set = (name: string, n: number): void => {
    if (b.has(name)) b.setNumber(b.slot(name), Math.max(0, n));
  };
  set('vms_registered', c.registered.used);
  set('vms_registered_max', c.registered.max);
  if (c.discovered) {
    set('vms_discovered', c.discovered.used);
    set('vms_discovered_max', c.discovered.max);
  }
  if (c.fds) {
    set('fds_open', c.fds.open);
    set('fds_max', c.fds.max);
    set('fds_available', c.fds.available);
  }
}
