/** Host energy for HOST_UPDATE: per package since sampling started, its energy and the part no VM got; the daemon-wide counters it carries. */
import type { HostValues, DaemonCounters } from '../../protocol/v2/codec.js';
import type { LegacyCounters } from '../legacy/legacy-service.js';
import type { SamplingStats } from '../../sampling/sampling-service.js';
import type { OtherDomain } from '../../model/domains.js';
import { microjoules, type PackageInterval } from '../../ratio/outputs.js';

/** One package's totals since sampling started (J). */
interface PackageTotals {
  pkg: number;
  energyJ: number;
  unattributedJ: number;
}

/** The same of one other RAPL domain on one package; psys under the package it is read on. */
interface DomainTotals extends PackageTotals {
  domain: OtherDomain;
}

export interface HostEnergyState {
  /** Monotonic time of the last sample (0n before the first). */
  tNs: bigint;
  packages: PackageTotals[];
  /** The other domains' totals (absent: only the package is read). */
  domains?: DomainTotals[];
}

export class HostEnergy {
  private readonly totals = new Map<number, { energyJ: number; unattributedJ: number }>();
  /** The other domains' totals, in the order the host lists its domain counters (then as they came). */
  private readonly domainTotals: DomainTotals[] = [];
  /** The same per package and domain. */
  private readonly domainOf = new Map<number, Map<OtherDomain, DomainTotals>>();
  private tNs = 0n;

  /** Every package and domain counter starts at zero, or where `from` left off (a domain no longer read is dropped). */
  constructor(packages: readonly number[], from?: HostEnergyState, domains: readonly { pkg: number; domain: OtherDomain }[] = []) {
    for (const pkg of packages) this.totals.set(pkg, { energyJ: 0, unattributedJ: 0 });
    for (const d of domains) this.domainTotalsOf(d.pkg, d.domain);
    if (from === undefined) return;
    this.tNs = from.tNs;
    for (const p of from.packages) this.totals.set(p.pkg, { energyJ: p.energyJ, unattributedJ: p.unattributedJ });
    for (const d of from.domains ?? []) {
      const k = this.domainOf.get(d.pkg)?.get(d.domain);
      if (k) Object.assign(k, { energyJ: d.energyJ, unattributedJ: d.unattributedJ });
    }
  }

  /** One sample: its time, and its packages' energy (none when it was a baseline). */
  add(tNs: bigint, packages: readonly PackageInterval[]): void {
    this.tNs = tNs;
    for (const p of packages) {
      let k = this.totals.get(p.pkg);
      if (!k) this.totals.set(p.pkg, (k = { energyJ: 0, unattributedJ: 0 }));
      addInterval(k, p);
      if (p.domains !== undefined) for (const d of p.domains) addInterval(this.domainTotalsOf(p.pkg, d.domain), d);
    }
  }

  /** The totals of `domain` on `pkg`, made at zero (and listed last) when there are none yet. */
  private domainTotalsOf(pkg: number, domain: OtherDomain): DomainTotals {
    let byDomain = this.domainOf.get(pkg);
    if (byDomain === undefined) this.domainOf.set(pkg, (byDomain = new Map()));
    let t = byDomain.get(domain);
    if (t === undefined) {
      byDomain.set(domain, (t = { pkg, domain, energyJ: 0, unattributedJ: 0 }));
      this.domainTotals.push(t);
    }
    return t;
  }

  /** The other domains' totals in floored µJ, as the package's are given (the host statistics file's `<domain>_energy`, HOST_UPDATE's domain block). */
  domainsUj(): { pkg: number; domain: OtherDomain; energyUj: bigint; unattributedUj: bigint }[] {
    return this.domainTotals.map((d) => ({
      pkg: d.pkg,
      domain: d.domain,
      energyUj: BigInt(microjoules(d.energyJ)),
      unattributedUj: BigInt(microjoules(d.unattributedJ)),
    }));
  }

  /** HOST_UPDATE's values; per-package unattributed energy only when `perPackage`, the domains' totals only when `domains`. */
  values(vmsChanged: boolean, perPackage: boolean, stats: DaemonCounters, domains = false): HostValues {
    let unattributedJ = 0;
    for (const k of this.totals.values()) unattributedJ += k.unattributedJ;
    const out: HostValues = {
      tNs: this.tNs,
      packages: [...this.totals].map(([pkg, k]) => ({
        pkg,
        energyUj: BigInt(microjoules(k.energyJ)),
        unattributedUj: perPackage ? BigInt(microjoules(k.unattributedJ)) : null,
      })),
      unattributedUj: BigInt(microjoules(unattributedJ)),
      vmsChanged,
      stats,
    };
    if (domains) out.domains = this.domainsUj();
    return out;
  }

  state(): HostEnergyState {
    const out: HostEnergyState = { tNs: this.tNs, packages: [...this.totals].map(([pkg, k]) => ({ pkg, ...k })) };
    if (this.domainTotals.length > 0) out.domains = this.domainTotals.map((d) => ({ ...d }));
    return out;
  }
}

/** Adds an interval's energy and the part no VM got, never negative (attributed passes energy only by rounding). */
function addInterval(k: { energyJ: number; unattributedJ: number }, i: { energyJ: number; attributedJ: number }): void {
  k.energyJ += i.energyJ;
  k.unattributedJ += Math.max(0, i.energyJ - i.attributedJ);
}

/** Daemon-wide health counters HOST_UPDATE carries (legacy requests, connections). */
export interface HealthSource {
  legacy: LegacyCounters;
  connections(): number;
}

/** HOST_UPDATE's stats; without a health source (the v2 service alone) legacy counts 0, connections the v2 ones. */
export function daemonCounters(
  health: HealthSource | undefined,
  sampling: SamplingStats,
  v2Connections: number,
  vms: number,
): DaemonCounters {
  return {
    legacyOk: BigInt(health?.legacy.ok ?? 0),
    legacyRefused: BigInt(health?.legacy.refused ?? 0),
    legacyFailed: BigInt(health?.legacy.failed ?? 0),
    lastSampleDurationNs: sampling.lastDurationNs,
    samples: BigInt(sampling.samples),
    sampleFailures: BigInt(sampling.failures),
    connections: health ? health.connections() : v2Connections,
    vms,
  };
}
