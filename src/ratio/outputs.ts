/** What the ratio engine gives: each interval's energy per package and VM, and each VM's totals (docs/ratio.md "Outputs"). */
import type { OtherDomain } from '../model/domains.js';

export interface PackageInterval {
  pkg: number;
  energyJ: number;
  attributedJ: number;
  /** The other domains of this package that have an energy for the interval (psys under the lowest package). */
  domains?: DomainInterval[];
}

export type DomainInterval = Omit<PackageInterval, 'pkg' | 'domains'> & { domain: OtherDomain };

export type VmDomainEnergy = Pick<VmInterval, 'vpkgEnergyJ'> & { domain: OtherDomain };

export interface VmInterval {
  vmId: number;
  pid: number;
  /** Joules per vpkg, index = vpkg, length = nvpkg. */
  vpkgEnergyJ: number[];
  /** The same for every other domain the host reads, in ENERGY_DOMAINS order; an idle VM's is shared (read only). */
  domains?: VmDomainEnergy[];
}

export interface IntervalResult {
  tNs: bigint;
  dtS: number;
  packages: PackageInterval[];
  vms: VmInterval[];
  /** vmIds that ended with this sample (process gone or pid reused): frozen from now on. */
  ended: number[];
  /** Stat lines the engine could not parse in this sample (treated as absent threads). */
  problems: string[];
}

/** Published per-virtual-package values (ratio.md "Outputs"). */
export interface VpkgOutput {
  vpkg: number;
  energyJ: number;
  /** floor(A * 1e6). */
  energyUj: bigint;
  /** floor(A / u_guest) mod 2^32. */
  counter: number;
}

export interface VmOutput {
  vmId: number;
  pid: number;
  name?: string;
  /** Process ended (absent or pid reused) or unregistered: values are frozen. */
  ended: boolean;
  endedBy?: 'exit' | 'unregister';
  /** Monotonic time of the sample the values come from (0n before the first interval). */
  tNs: bigint;
  vpkgs: VpkgOutput[];
  /** Every other domain the host reads, in ENERGY_DOMAINS order; absent when only the package is read. */
  domains?: { domain: OtherDomain; vpkgEnergyJ: number[]; vpkgEnergyUj: bigint[] }[];
}

/** A VM's totals as its statistics file shows them, refilled in place at each sample (RatioEngine.totalsInto). */
export interface VmTotals {
  /** The VM they are of, and the engine's count of its changes when they were filled (-1: never). */
  vmId: number;
  changes: number;
  tNs: bigint;
  ended: boolean;
  /** Per vpkg: VpkgOutput.energyUj as a number (exact below 2^53), and VpkgOutput.counter. */
  energyUj: number[];
  counter: number[];
  /** Per other domain, in VmOutput.domains' order. */
  domains: { domain: OtherDomain; energyUj: number[] }[];
  /** RatioEngine.threadTotals' vcpus without the vpkg. */
  vcpus: { tid: number; energyJ: number; ticks: number }[];
  otherTicks: number;
}

export function emptyVmTotals(): VmTotals {
  return { vmId: -1, changes: -1, tNs: 0n, ended: false, energyUj: [], counter: [], domains: [], vcpus: [], otherTicks: 0 };
}

/** A published µJ count: floor(J x 1e6). */
export function microjoules(j: number): number {
  return Math.floor(j * 1e6);
}
