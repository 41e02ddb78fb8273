/**
 * What an energy source gives: per package and RAPL domain, the energy counted so far in µJ (never going
 * back: the source adds each wrap of its counter) and the counter behind it, as the hardware or the
 * kernel gives it. The ratio engine and traces work on that counter (a RAPL MSR's bits 31:0 in units
 * of the package's ESU), so they stay exact; a source without MSRs (powercap's energy_uj, wrapping at
 * max_energy_range_uj) describes its own counter rather than pretending to be an MSR.
 */
import type { EnergySourceKind } from './kinds.js';

/**
 * RAPL domains a source may report. Only the package is read today; issue 19 adds DRAM (0x619),
 * PP0 (0x639), PP1 (0x641), PSYS (0x64D), AMD's per-core energy and the powercap zones.
 */
export const ENERGY_DOMAINS = ['package'] as const;

export type EnergyDomain = (typeof ENERGY_DOMAINS)[number];

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
  readonly package: number;
  readonly domain: EnergyDomain;
  /**
   * µJ counted from the counter's zero before the source's first read: the counter's value at that
   * read, plus every count since, wraps added (CounterUnwrapper, counter-unwrapper.ts). Never goes back,
   * as long as the source is read at least once per wrap (the interval bounds in cli/options.ts).
   */
  readonly energyUj: bigint;
  readonly counter: EnergyCounter;
}

export interface EnergySource {
  readonly kind: EnergySourceKind;
  /** Package ids, ascending. */
  readonly packages: readonly number[];
  /** The domains each read reports for every package, in ENERGY_DOMAINS order. */
  readonly domains: readonly EnergyDomain[];
  /**
   * One reading per package and domain, packages ascending, domains in order. Throws an
   * EnergyReadError, never a partial reading, when one cannot be read.
   */
  read(): EnergyReading[];
  /** One line for trace notes and logs: where the numbers come from. */
  describe(): string;
  /** Releases what the source opened itself (not a device it was given). Can be called twice. */
  close(): void;
}

/** A read of an energy source failed; `cause` is the underlying error (an MsrReadError, a file system error). */
export class EnergyReadError extends Error {
  constructor(
    message: string,
    readonly kind: EnergySourceKind,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = 'EnergyReadError';
  }
}

/** The package domain's counter per package, as a Sample and a trace carry it. */
export function packageCounters(readings: readonly EnergyReading[]): Map<number, bigint> {
  const out = new Map<number, bigint>();
  for (const r of readings) if (r.domain === 'package') out.set(r.package, r.counter.raw);
  return out;
}
