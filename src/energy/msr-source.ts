/** Energy from the RAPL MSRs: each domain of MSR_DOMAINS the host has, read through each package's first CPU (per core: each core's). */
import { cannot } from '../common/errors.js';
import type { CpuModel } from '../msr/vendor.js';
import type { MsrDevice } from '../msr/device.js';
import { powerUnitMsr } from '../msr/registers.js';
import { firstCpuPerCore, firstCpuPerPackage } from '../msr/topology.js';
import { energyCounterBits, formatMsrHex, joulesPerCounterUnit, RAPL_COUNTER_RANGE } from '../ratio/counter.js';
import type { DomainCounter, HostCpu, Vendor } from '../model/host.js';
import { CounterUnwrapper } from './counter-unwrapper.js';
import {
  describeRead,
  ENERGY_DOMAINS,
  EnergyReadError,
  readEach,
  PLATFORM_DOMAINS,
  type EnergyDomain,
  type EnergyReading,
  type EnergySource,
} from './energy-source.js';
import { domainUnitJ, MSR_DOMAINS, type RegisterScope } from './msr-domains.js';

export interface MsrSourceOptions {
  device: MsrDevice;
  cpus: readonly HostCpu[];
  vendor: Vendor;
  /** sysfs, for the core ids of per-core registers (AMD). */
  sysRoot: string;
  /** Family and model from /proc/cpuinfo: some domains count in a unit of their own (msr-domains.ts). */
  model?: CpuModel;
  /** The domains to read (--domains); the package is always read. Absent: every domain found. */
  domains?: readonly EnergyDomain[];
}

/** One domain found: its register, and per package its unit and the CPUs its register is read through. */
interface DomainPlan {
  domain: EnergyDomain;
  msr: number;
  scope: RegisterScope;
  unitJ: Map<number, number>;
  cpus: Map<number, number[]>;
}

/** One counter read() reads: a domain on one package, in read order; `key` names it to the unwrapper. */
interface ReadSlot {
  pkg: number;
  domain: EnergyDomain;
  plan: DomainPlan;
  unitJ: number;
  /** The CPUs its register is read through (several: per-core registers, summed). */
  cpus: readonly number[];
  key: string;
}

export class MsrEnergySource implements EnergySource {
  readonly kind = 'msr';
  readonly packages: number[];
  readonly domains: readonly EnergyDomain[];
  readonly domainCounters: readonly DomainCounter[];
  /** Domains of the vendor's table not read, and why (absent, or left out by --domains). */
  readonly absent: { domain: EnergyDomain; why: string }[] = [];
  private readonly plans: DomainPlan[] = [];
  /** Packages ascending, each one's domains in order (a platform domain under the first package only). */
  private readonly slots: ReadSlot[];
  private readonly unwrap = new CounterUnwrapper();

  /**
   * Probes the vendor's domains: present when its register reads on every package (each core) and counts (at 0: absent, as
   * Linux's intel_rapl). Throws EnergyReadError when a power unit cannot be read, an Error when a `domains` one is absent.
   */
  constructor(private readonly o: MsrSourceOptions) {
    const cpuOf = firstCpuPerPackage(o.cpus);
    this.packages = [...cpuOf.keys()].sort((a, b) => a - b);
    const esu = new Map<number, number>();
    try {
      for (const pkg of this.packages) esu.set(pkg, joulesPerCounterUnit(o.device.read(cpuOf.get(pkg)!, powerUnitMsr(o.vendor))));
    } catch (e) {
      throw new EnergyReadError(e instanceof Error ? e.message : String(e), this.kind, { cause: e });
    }
    const table = MSR_DOMAINS[o.vendor];
    for (const domain of ENERGY_DOMAINS) {
      const reg = table[domain];
      if (reg === undefined) continue;
      if (domain !== 'package' && o.domains !== undefined && !o.domains.includes(domain)) {
        this.absent.push({ domain, why: 'not in --domains' });
        continue;
      }
      const plan: DomainPlan = { domain, msr: reg.msr, scope: reg.scope, unitJ: new Map(), cpus: new Map() };
      const packages = PLATFORM_DOMAINS.has(domain) ? this.packages.slice(0, 1) : this.packages;
      for (const pkg of packages) plan.unitJ.set(pkg, domainUnitJ(o.vendor, domain, esu.get(pkg)!, o.model));
      let why: string | undefined;
      try {
        const perCore = reg.scope === 'core' ? firstCpuPerCore(o.sysRoot, o.cpus) : undefined;
        for (const pkg of packages) plan.cpus.set(pkg, perCore?.get(pkg) ?? [cpuOf.get(pkg)!]);
        if (domain !== 'package') why = this.probe(plan);
      } catch (e) {
        why = e instanceof Error ? e.message : String(e);
      }
      if (why === undefined) this.plans.push(plan);
      else if (o.domains?.includes(domain)) throw new Error(cannot(`read the ${domain} domain`, why, `leave ${domain} out of --domains`));
      else this.absent.push({ domain, why });
    }
    this.domains = this.plans.map((p) => p.domain);
    this.slots = this.packages.flatMap((pkg) =>
      this.plans.flatMap((plan) => {
        const unitJ = plan.unitJ.get(pkg);
        return unitJ === undefined
          ? []
          : [{ pkg, domain: plan.domain, plan, unitJ, cpus: plan.cpus.get(pkg)!, key: `${plan.domain} ${pkg}` }];
      }),
    );
    this.domainCounters = this.plans.flatMap(({ domain, unitJ }) =>
      domain === 'package' ? [] : [...unitJ].map(([pkg, u]) => ({ pkg, domain, range: RAPL_COUNTER_RANGE, unitJ: u })),
    );
  }

  /** Why the domain's registers do not count, or undefined when they do. */
  private probe(plan: DomainPlan): string | undefined {
    const hex = formatMsrHex(plan.msr);
    let anyCounts = false;
    for (const [pkg, cpus] of plan.cpus) {
      let counts = false;
      for (const cpu of cpus) {
        try {
          if (energyCounterBits(this.o.device.read(cpu, plan.msr)) !== 0) counts = true;
        } catch (e) {
          return `MSR ${hex}: ${e instanceof Error ? e.message : String(e)}`;
        }
      }
      if (!counts && plan.scope !== 'core') return `MSR ${hex} reads 0 on package ${pkg} (not counting)`;
      anyCounts ||= counts;
    }
    return anyCounts ? undefined : `MSR ${hex} reads 0 on every core (not counting)`;
  }

  /** readEach: a failing package domain's EnergyReadError has the MsrReadError as its cause (msrErrorWithHint reads it). */
  read(): EnergyReading[] {
    return readEach(this.kind, this.slots, (s) => this.readSlot(s));
  }

  /** Per-core registers summed (bits 31:0) mod 2^32: wraps as one counter, and depends on the registers alone (restarts, traces). */
  private readSlot(slot: ReadSlot): EnergyReading {
    const { plan, cpus } = slot;
    let raw: bigint;
    if (plan.scope !== 'core') raw = this.o.device.read(cpus[0]!, plan.msr);
    else {
      let sum = 0n;
      for (const cpu of cpus) sum += this.o.device.read(cpu, plan.msr) % RAPL_COUNTER_RANGE;
      raw = sum % RAPL_COUNTER_RANGE;
    }
    const counter = { raw, range: RAPL_COUNTER_RANGE, unitJ: slot.unitJ };
    return { pkg: slot.pkg, domain: plan.domain, energyUj: this.unwrap.energyUj(slot.key, counter), counter };
  }

  /** The domains read, each with its unit (µJ per count, package 0's), and the domains not read with why. */
  describe(): string {
    const first = this.packages[0]!;
    const found = this.plans.map(
      (p) => `${p.domain} ${formatMsrHex(p.msr)}${p.scope === 'core' ? ' per core' : ''} (${fmtUnit(p.unitJ.get(first)!)})`,
    );
    return describeRead('RAPL MSRs', found, this.absent);
  }

  /** The device belongs to the caller (it is shared with the legacy server); nothing to close here. */
  close(): void {}
}

function fmtUnit(unitJ: number): string {
  return unitJ >= 1 ? `${unitJ} J` : `${Number((unitJ * 1e6).toPrecision(4))} µJ`;
}
