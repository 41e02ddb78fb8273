/**
 * What the sampler reads and a vmsr-trace stores: one sample of the counters and stat lines, and the
 * trace's header. Pure data (docs/trace-format.md).
 */
import type { OtherDomain } from './domains.js';
import type { HostInfo } from './host.js';

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
  pkg: number;
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
