/** What the sampler reads and a vmsr-trace stores (docs/trace-format.md). */
import type { OtherDomain } from './domains.js';
import type { HostInfo } from './host.js';

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

/** `raw` counts in the units of the host's DomainCounter for (package, domain), wrapping at its range. */
export interface DomainReading {
  pkg: number;
  domain: OtherDomain;
  raw: bigint;
}

/** One sample S(i). */
export interface Sample {
  /** CLOCK_MONOTONIC, nanoseconds. */
  tNs: bigint;
  /** Raw package counter per package id. */
  energy: Map<number, bigint>;
  /** For each registered pid that exists: tid -> verbatim stat line (no trailing newline). */
  tasks: Map<number, Map<number, string>>;
  /** The other domains' counters; a domain that failed this time is missing. */
  domains?: DomainReading[];
}
