/**
 * The host as the engine, sampler, traces and daemon know it: its vendor, CPUs, packages and energy
 * counters. Pure data, no I/O; field meanings follow docs/ratio.md and docs/trace-format.md.
 */
import type { OtherDomain } from './domains.js';

/** CPU vendors whose RAPL MSRs the helper knows. */
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
  /**
   * Raw MSR_RAPL_POWER_UNIT (0x606) of this package: the unit of its energy counter unless `counter`
   * says otherwise, and the unit of its VMs' (guest) counters.
   */
  powerUnit: bigint;
  /**
   * The package energy counter when it is not a RAPL MSR's (powercap: µJ, wrapping after
   * max_energy_range_uj). Absent: bits 31:0 in units of powerUnit's ESU (ratio/counter.ts packageCounter).
   */
  counter?: CounterSpec;
  /** Raw MSR_PKG_POWER_LIMIT (0x610), when known. */
  powerLimit?: bigint;
  /** Raw MSR_PKG_POWER_INFO (0x614), when known. */
  powerInfo?: bigint;
}

/** What the engine needs to know about the host: the trace header's `host` plus CLK_TCK. */
export interface HostInfo {
  vendor: Vendor;
  clkTck: number;
  /** Online logical CPUs and their package. */
  cpus: HostCpu[];
  packages: HostPackage[];
  /**
   * The counters of the RAPL domains other than the package the host's source reads (core, uncore, dram
   * per package; psys once, under the lowest package): absent or empty when only the package is read.
   */
  domains?: DomainCounter[];
}

/** The counter of one RAPL domain other than the package, on one package (docs/energy-domains.md). */
export interface DomainCounter extends CounterSpec {
  pkg: number;
  domain: OtherDomain;
}
