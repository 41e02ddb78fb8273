/**
 * Data shared by the ratio engine, the sampler, traces and the daemon. Pure data, no I/O.
 * Field meanings follow docs/ratio.md and docs/trace-format.md.
 */
import type { OtherDomain } from './domains.js';

/** CPU vendors whose RAPL MSRs the helper knows. */
export type Vendor = 'intel' | 'amd';

/** vCPUs one VM may have, and the highest virtual package: the v2 protocol's bounds, used everywhere. */
export const MAX_VCPUS = 4096;
export const MAX_VPKG = 255;
/** Highest process or thread id accepted anywhere (pid_t is a signed 32-bit int; Linux's own limit is 2^22). */
export const MAX_TID = 0x7fffffff;
/**
 * The most VMs anything holds at once, whatever it is given: a replay (a trace may register VMs without
 * end), the exporter's --max-vms, a restart snapshot. The daemon's own caps are far below it:
 * DEFAULT_MAX_DISCOVERED_VMS (discovery) and DEFAULT_V2_LIMITS.maxVms (registrations).
 */
export const MAX_VMS = 100_000;

export interface HostCpu {
  cpu: number;
  package: number;
}

/** An energy counter as a source gives it: it counts 0..range-1 and wraps to 0, each count unitJ joules. */
export interface CounterSpec {
  range: bigint;
  unitJ: number;
}

export interface HostPackage {
  package: number;
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
  package: number;
  domain: OtherDomain;
}

export interface VcpuSpec {
  tid: number;
  /** Virtual package (socket) of this vCPU in the guest, 0..255. */
  vpkg: number;
}

export interface VmSpec {
  pid: number;
  /** Field 22 of /proc/<pid>/stat at registration; a different value later means the pid was reused. */
  starttime: number;
  name?: string;
  vcpus: VcpuSpec[];
}

/** The header of a vmsr-trace: what the engine needs about the host, and free text. */
export interface TraceHeader {
  host: HostInfo;
  note?: string;
  /** Wall-clock time the recording started, ISO 8601 UTC (header `start_time`). */
  startTime?: string;
  /** CLOCK_MONOTONIC at that same moment, ns (header `start_t_ns`): wall time of any t_ns follows. */
  startNs?: bigint;
  /** Host name of the recording machine (header `hostname`). */
  hostname?: string;
}

/**
 * A RAPL domain's counter at a sample, as read: `raw` counts in the units of the host's DomainCounter
 * for (package, domain), wrapping at its range, as the package counter does.
 */
export interface DomainReading {
  package: number;
  domain: OtherDomain;
  raw: bigint;
}

/** One sample S(i): what the sampler read, in the form a trace stores it. */
export interface Sample {
  /** CLOCK_MONOTONIC, nanoseconds. */
  tNs: bigint;
  /** Raw MSR_PKG_ENERGY_STATUS per package id (an energy source's package counter, energy/energy-source.ts). */
  energy: Map<number, bigint>;
  /** For each registered pid that exists: tid -> verbatim stat line (no trailing newline). */
  tasks: Map<number, Map<number, string>>;
  /**
   * The counters of the domains other than the package (HostInfo.domains), when the source reads more
   * than the package. A domain that failed this time is missing from it.
   */
  domains?: DomainReading[];
}

export interface PackageInterval {
  package: number;
  energyJ: number;
  attributedJ: number;
  /** The other domains of this package that have an energy for the interval (psys under the lowest package). */
  domains?: DomainInterval[];
}

/** One RAPL domain's energy on a package over an interval, and what of it went to VMs. */
export interface DomainInterval {
  domain: OtherDomain;
  energyJ: number;
  attributedJ: number;
}

/** A VM's energy of one RAPL domain other than the package, per virtual package. */
export interface VmDomainEnergy {
  domain: OtherDomain;
  /** Joules per vpkg, index = vpkg, length = nvpkg. */
  vpkgEnergyJ: number[];
}

export interface VmInterval {
  /** Engine-assigned id of the registration (the v2 vm_id). */
  vmId: number;
  pid: number;
  /** energyJ per vpkg, index = vpkg, length = nvpkg. */
  vpkgEnergyJ: number[];
  /** The same for every other domain the host reads (HostInfo.domains), in ENERGY_DOMAINS order; an idle VM's is shared (read only). */
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
  /** Accumulated joules (float64). */
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
  /** Why it ended, when it did: its process went away, or its client unregistered it. */
  endedBy?: 'exit' | 'unregister';
  /** Monotonic time of the sample the values come from (0n before the first interval). */
  tNs: bigint;
  vpkgs: VpkgOutput[];
  /**
   * Accumulated energy of every other domain the host reads (HostInfo.domains), in ENERGY_DOMAINS order,
   * per virtual package: `vpkgEnergyJ[g]` joules (float64) and `vpkgEnergyUj[g]` = floor(x 1e6). Absent
   * when only the package is read.
   */
  domains?: VmDomainTotals[];
}

interface VmDomainTotals {
  domain: OtherDomain;
  vpkgEnergyJ: number[];
  vpkgEnergyUj: bigint[];
}
