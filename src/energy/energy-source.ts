/** What an energy source gives: per package and domain, µJ so far and the raw counter behind it (the engine and traces work on it). */
import type { EnergyDomain } from '../model/domains.js';
import { cannot } from '../common/errors.js';
import type { DomainCounter } from '../model/host.js';
import type { DomainReading } from '../model/sample.js';
import type { EnergySourceKind } from './kinds.js';

export { ENERGY_DOMAINS, isEnergyDomain, PLATFORM_DOMAINS, type EnergyDomain } from '../model/domains.js';

/** A hardware (or kernel) energy counter at one read. */
export interface EnergyCounter {
  /** The value as read: a RAPL MSR's whole 64-bit register (bits 31:0 count, the rest is reserved), powercap's energy_uj. */
  readonly raw: bigint;
  /** The counted part, raw mod range, runs 0..range-1 and then wraps to 0: 2^32 for a RAPL MSR. */
  readonly range: bigint;
  /** Joules per count: 2^-ESU for a RAPL MSR, 1e-6 for powercap. */
  readonly unitJ: number;
}

export interface EnergyReading {
  readonly pkg: number;
  readonly domain: EnergyDomain;
  /** µJ since the counter's zero before the first read, wraps added: never goes back if read once per wrap (cli/options.ts). */
  readonly energyUj: bigint;
  readonly counter: EnergyCounter;
}

export interface EnergySource {
  readonly kind: EnergySourceKind;
  /** Package ids, ascending. */
  readonly packages: readonly number[];
  /** The domains each read reports for every package, in ENERGY_DOMAINS order. */
  readonly domains: readonly EnergyDomain[];
  /** The counter of every domain but the package, in read() order (HostInfo.domains); empty when only the package is read. */
  readonly domainCounters: readonly DomainCounter[];
  /** One reading per package and domain (a platform domain once), in order; throws an EnergyReadError as readEach says. */
  read(): EnergyReading[];
  /** One line for trace notes and logs: where the numbers come from. */
  describe(): string;
  /** Releases what the source opened itself (not a device it was given). Can be called twice. */
  close(): void;
}

/** A read of an energy source failed. With `readings`: only the domains named in `domains` failed, the rest was read. */
export class EnergyReadError extends Error {
  readonly domains?: readonly EnergyDomain[];
  readonly readings?: readonly EnergyReading[];

  constructor(
    message: string,
    readonly kind: EnergySourceKind,
    options?: { cause?: unknown; partial?: { domains: readonly EnergyDomain[]; readings: readonly EnergyReading[] } },
  ) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.name = 'EnergyReadError';
    if (options?.partial) {
      this.domains = options.partial.domains;
      this.readings = options.partial.readings;
    }
  }
}

/** `read` of each of `counters` in order: the package's failure fails it, others' give an EnergyReadError carrying the rest read. */
export function readEach<C extends { domain: EnergyDomain }>(
  kind: EnergySourceKind,
  counters: readonly C[],
  read: (c: C) => EnergyReading,
): EnergyReading[] {
  const readings: EnergyReading[] = [];
  const failed: { domain: EnergyDomain; error: unknown }[] = [];
  for (const c of counters) {
    try {
      readings.push(read(c));
    } catch (e) {
      if (c.domain === 'package') throw new EnergyReadError(e instanceof Error ? e.message : String(e), kind, { cause: e });
      failed.push({ domain: c.domain, error: e });
    }
  }
  if (failed.length === 0) return readings;
  const domains = [...new Set(failed.map((f) => f.domain))];
  const why = failed.map((f) => (f.error instanceof Error ? f.error.message : String(f.error))).join('; ');
  const message = cannot(
    `read the ${domains.join(', ')} domain${domains.length > 1 ? 's' : ''}`,
    why,
    'the package and other domains go on',
  );
  throw new EnergyReadError(message, kind, { cause: failed[0]!.error, partial: { domains, readings } });
}

/** describe()'s line: where the counters come from, those read, and those not read with why. */
export function describeRead(from: string, found: readonly string[], absent: readonly { domain: string; why: string }[]): string {
  const not = absent.map((a) => `${a.domain}: ${a.why}`);
  return `energy counters read from ${from}: ${found.join(', ')}${not.length > 0 ? `; not read: ${not.join(', ')}` : ''}`;
}

/** The counters of the domains other than the package, as a Sample and a trace carry them. */
export function domainReadings(readings: readonly EnergyReading[]): DomainReading[] {
  const out: DomainReading[] = [];
  for (const r of readings) if (r.domain !== 'package') out.push({ pkg: r.pkg, domain: r.domain, raw: r.counter.raw });
  return out;
}

/** The package domain's counter per package, as a Sample and a trace carry it. */
export function packageCounters(readings: readonly EnergyReading[]): Map<number, bigint> {
  const out = new Map<number, bigint>();
  for (const r of readings) if (r.domain === 'package') out.set(r.pkg, r.counter.raw);
  return out;
}
