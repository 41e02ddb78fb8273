/**
 * THE contract every EnergySource keeps, as one suite run against each implementation (as hono runs
 * one suite over every router): the packages and domains it names, one reading for each and nothing
 * else, counters that move by exactly the energy used (wrapping like the hardware's), energy in µJ
 * that never goes back (also across a wrap or a failed read), a failure that throws an EnergyReadError
 * instead of giving a partial reading, and recovery once the cause is gone. Every check holds for
 * every domain the source reads.
 */
import { afterEach, describe, expect, test } from 'vitest';
import {
  ENERGY_DOMAINS,
  EnergyReadError,
  PLATFORM_DOMAINS,
  type EnergyDomain,
  type EnergyReading,
  type EnergySource,
} from '../../src/energy/energy-source.js';
import { ENERGY_SOURCE_KINDS } from '../../src/energy/kinds.js';

/** [package, domain] of every reading a source of these packages and domains gives, in read() order (psys on the first package only). */
function readingSlots(packages: readonly number[], domains: readonly EnergyDomain[]): [number, EnergyDomain][] {
  return packages.flatMap((p, i) => domains.filter((d) => i === 0 || !PLATFORM_DOMAINS.has(d)).map((d): [number, EnergyDomain] => [p, d]));
}

export interface SourceUnderTest {
  source: EnergySource;
  /** The host's package ids, ascending. */
  packages: number[];
  /** Makes the next read show `units` more counter units on every package and domain. */
  advance(units: number): void;
  /** The counter a reading of this domain runs on: its range, and its counted part at the first read. */
  counter(r: EnergyReading): { range: bigint; start: bigint };
  /** The domains the source must find on this host (ENERGY_DOMAINS order). */
  domains: string[];
  /** Makes reads fail (device or /proc gone) ... */
  breakIt(): void;
  /** ... and work again. */
  repair(): void;
  /** Counter units the source may round away in one reading (a synthetic source floors a float). */
  tolerance: number;
  cleanup(): void;
}

/** Every source starts with its counters this close below 2^32, so a wrap comes early. */
export const START_COUNTER = 0xfffff000;

/** How far a counter moved from a to b: the counted parts' distance modulo the range. */
const delta = (a: EnergyReading, b: EnergyReading): number => {
  const range = b.counter.range;
  return Number(((((b.counter.raw % range) - (a.counter.raw % range)) % range) + range) % range);
};

/** "package domain" -> its reading. */
const byPackage = (rs: EnergyReading[]): Map<string, EnergyReading> => new Map(rs.map((r) => [`${r.pkg} ${r.domain}`, r]));
const pkgIds = (rs: EnergyReading[]): number[] => rs.filter((r) => r.domain === 'package').map((r) => r.pkg);

/** µJ of `units` counter units, and how far a reading may be off: the source's rounding plus 1 µJ of flooring. */
const uj = (r: EnergyReading, units: number): number => units * r.counter.unitJ * 1e6;
const ujTolerance = (r: EnergyReading, s: SourceUnderTest): number => uj(r, s.tolerance) + 1;

export function energySourceContract(name: string, make: () => SourceUnderTest): void {
  describe(`EnergySource contract: ${name}`, () => {
    let made: SourceUnderTest[] = [];
    const fresh = (): SourceUnderTest => {
      const s = make();
      made.push(s);
      return s;
    };
    afterEach(() => {
      for (const s of made) s.cleanup();
      made = [];
    });

    test('names the host packages, ascending, and reads exactly those', () => {
      const s = fresh();
      expect(s.source.packages).toEqual(s.packages);
      expect(pkgIds(s.source.read()).sort((a, b) => a - b)).toEqual(s.packages);
    });

    test('reads one reading per package and domain, packages ascending, domains in their order, and says which kind it is', () => {
      const s = fresh();
      expect(ENERGY_SOURCE_KINDS).toContain(s.source.kind);
      expect(s.source.domains).toContain('package');
      expect(s.source.domains).toEqual(ENERGY_DOMAINS.filter((d) => s.source.domains.includes(d)));
      expect(s.source.domains).toEqual(s.domains);
      const expected = readingSlots(s.packages, s.source.domains);
      expect(s.source.read().map((r) => [r.pkg, r.domain])).toEqual(expected);
      expect(s.source.describe()).toMatch(/^\S.*\S$/);
      expect(s.source.describe()).not.toContain('\n');
    });

    test('counters count within their range (bits 31:0 of a u64 for a register) from where the host left them', () => {
      const s = fresh();
      for (const r of s.source.read()) {
        const v = r.counter.raw;
        const { range, start } = s.counter(r);
        expect(typeof v).toBe('bigint');
        expect(v >= 0n && v < 1n << 64n).toBe(true);
        expect(r.counter.range).toBe(range);
        expect(Math.abs(Number((v % range) - start))).toBeLessThanOrEqual(s.tolerance);
      }
    });

    test('energy in uJ starts at the counter value in its unit (the origin is the counter zero)', () => {
      const s = fresh();
      for (const r of s.source.read()) {
        expect(r.counter.unitJ).toBeGreaterThan(0);
        expect(Math.abs(Number(r.energyUj) - uj(r, Number(r.counter.raw % r.counter.range)))).toBeLessThanOrEqual(1);
      }
    });

    test('moves by exactly the energy used, and not at all when none is', () => {
      const s = fresh();
      const a = byPackage(s.source.read());
      const still = byPackage(s.source.read());
      for (const [k, r] of still) expect(delta(a.get(k)!, r)).toBeLessThanOrEqual(s.tolerance);
      s.advance(1000);
      const b = s.source.read();
      for (const r of b) expect(Math.abs(delta(still.get(`${r.pkg} ${r.domain}`)!, r) - 1000)).toBeLessThanOrEqual(s.tolerance);
      for (const [k, r] of byPackage(b)) {
        const before = still.get(k)!;
        expect(Math.abs(Number(r.energyUj - before.energyUj) - uj(r, 1000))).toBeLessThanOrEqual(ujTolerance(r, s));
      }
    });

    test('wraps at its range like the hardware counter, while the energy in uJ goes on growing', () => {
      const s = fresh();
      const a = byPackage(s.source.read());
      s.advance(0x2000); // START_COUNTER + 0x2000 is past 2^32
      const b = byPackage(s.source.read());
      for (const [k, rb] of b) {
        const ra = a.get(k)!;
        const { range, start } = s.counter(ra);
        if (start + 0x2000n >= range) expect(rb.counter.raw % range).toBeLessThan(ra.counter.raw % range);
        expect(Math.abs(delta(ra, rb) - 0x2000)).toBeLessThanOrEqual(s.tolerance);
        expect(rb.energyUj).toBeGreaterThan(ra.energyUj);
        expect(Math.abs(Number(rb.energyUj - ra.energyUj) - uj(rb, 0x2000))).toBeLessThanOrEqual(ujTolerance(rb, s));
      }
    });

    test('throws an EnergyReadError when its input is gone instead of returning a partial reading, and reads again once it is back', () => {
      const s = fresh();
      s.breakIt(); // the package domain's input: no reading to go on with
      let err: unknown;
      try {
        s.source.read();
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(EnergyReadError);
      expect((err as EnergyReadError).kind).toBe(s.source.kind);
      expect((err as EnergyReadError).message).toMatch(/^cannot /);
      expect((err as EnergyReadError).cause).toBeDefined();
      s.repair();
      const a = byPackage(s.source.read());
      expect(pkgIds([...a.values()]).sort((x, y) => x - y)).toEqual(s.packages);
      s.advance(500);
      const b = byPackage(s.source.read());
      for (const [k, r] of b) {
        expect(Math.abs(delta(a.get(k)!, r) - 500)).toBeLessThanOrEqual(s.tolerance);
        expect(r.energyUj).toBeGreaterThan(a.get(k)!.energyUj);
      }
    });

    test('close() can be called twice', () => {
      const s = fresh();
      s.source.read();
      s.source.close();
      expect(() => s.source.close()).not.toThrow();
    });
  });
}
