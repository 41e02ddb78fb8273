/** The host as the engine, sampler, traces and daemon know it (docs/ratio.md, docs/trace-format.md). */
import type { OtherDomain } from './domains.js';

export type Vendor = 'intel' | 'amd';

export interface HostCpu {
  cpu: number;
  pkg: number;
}

/** An energy counter as a source gives it: it counts 0..range-1 and wraps to 0, each count unitJ joules. */
export interface CounterSpec {
  range: bigint;
  unitJ: number;
}

export interface HostPackage {
  pkg: number;
  /** Raw MSR_RAPL_POWER_UNIT (0x606): its counter's unit unless `counter` says otherwise, and its VMs' counters' unit. */
  powerUnit: bigint;
  /** When it is not a RAPL MSR's (powercap: µJ). Absent: bits 31:0 in units of powerUnit's ESU. */
  counter?: CounterSpec;
  /** Raw MSR_PKG_POWER_LIMIT (0x610), when known. */
  powerLimit?: bigint;
  /** Raw MSR_PKG_POWER_INFO (0x614), when known. */
  powerInfo?: bigint;
}

export interface HostInfo {
  vendor: Vendor;
  clkTck: number;
  /** Online logical CPUs and their package. */
  cpus: HostCpu[];
  packages: HostPackage[];
  /** The other domains' counters (psys once, under the lowest package); absent or empty: only the package. */
  domains?: DomainCounter[];
}

export interface DomainCounter extends CounterSpec {
  pkg: number;
  domain: OtherDomain;
}
