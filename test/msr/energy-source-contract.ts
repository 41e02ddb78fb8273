/**
 * THE contract every EnergySource keeps, as one suite run against each implementation (as hono runs
 * one suite over every router): the packages and domains it names, one reading for each and nothing
 * else, counters that move by exactly the energy used (wrapping like the hardware's), energy in µJ
 * that never goes back (also across a wrap or a failed read), a failure that throws an EnergyReadError
 * instead of giving a partial reading, and recovery once the cause is gone.
 */
import { afterEach, describe, expect, test } from 'vitest';
import { ENERGY_DOMAINS, EnergyReadError, type EnergyReading, type EnergySource } from '../../src/energy/energy-source.js';
import { ENERGY_SOURCE_KINDS } from '../../src/energy/kinds.js';

export interface SourceUnderTest {
  source: EnergySource;
  /** The host's package ids, ascending. */
  packages: number[];
  /** Makes the next read show `units` more counter units on every package. */
  advance(units: number): void;
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

const delta = (a: bigint, b: bigint): number => Number((b - a) & 0xffffffffn);

/** Package id -> its package-domain reading. */
const byPackage = (rs: EnergyReading[]): Map<number, EnergyReading> => new Map(rs.filter((r) => r.domain === 'package').map((r) => [r.package, r]));
const counters = (rs: EnergyReading[]): Map<number, bigint> => new Map([...byPackage(rs)].map(([p, r]) => [p, r.counter.raw]));

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
      expect([...counters(s.source.read()).keys()].sort((a, b) => a - b)).toEqual(s.packages);
    });

    test('reads one reading per package and domain, packages ascending, domains in their order, and says which kind it is', () => {
      const s = fresh();
      expect(ENERGY_SOURCE_KINDS).toContain(s.source.kind);
      expect(s.source.domains).toContain('package');
      expect(s.source.domains).toEqual(ENERGY_DOMAINS.filter((d) => s.source.domains.includes(d)));
      const expected = s.packages.flatMap((p) => s.source.domains.map((d) => [p, d]));
      expect(s.source.read().map((r) => [r.package, r.domain])).toEqual(expected);
      expect(s.source.describe()).toMatch(/^\S.*\S$/);
      expect(s.source.describe()).not.toContain('\n');
    });

    test('counters are 32-bit values (bits 31:0 of a u64) that start where the host left them', () => {
      const s = fresh();
      for (const r of s.source.read()) {
        const v = r.counter.raw;
        expect(typeof v).toBe('bigint');
        expect(v >= 0n && v < 1n << 64n).toBe(true);
        expect(r.counter.range).toBe(1n << 32n);
        expect(Math.abs(delta(BigInt(START_COUNTER), v & 0xffffffffn))).toBeLessThanOrEqual(s.tolerance);
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
      const a = s.source.read();
      const still = s.source.read();
      const ca = counters(a);
      const cs = counters(still);
      for (const p of s.packages) expect(delta(ca.get(p)!, cs.get(p)!)).toBeLessThanOrEqual(s.tolerance);
      s.advance(1000);
      const b = s.source.read();
      const cb = counters(b);
      for (const p of s.packages) expect(Math.abs(delta(cs.get(p)!, cb.get(p)!) - 1000)).toBeLessThanOrEqual(s.tolerance);
      for (const [p, r] of byPackage(b)) {
        const before = byPackage(still).get(p)!;
        expect(Math.abs(Number(r.energyUj - before.energyUj) - uj(r, 1000))).toBeLessThanOrEqual(ujTolerance(r, s));
      }
    });

    test('wraps at 2^32 like the hardware counter, while the energy in uJ goes on growing', () => {
      const s = fresh();
      const a = s.source.read();
      s.advance(0x2000); // START_COUNTER + 0x2000 is past 2^32
      const b = s.source.read();
      const ca = counters(a);
      const cb = counters(b);
      for (const p of s.packages) {
        expect(cb.get(p)! & 0xffffffffn).toBeLessThan(ca.get(p)! & 0xffffffffn);
        expect(Math.abs(delta(ca.get(p)!, cb.get(p)!) - 0x2000)).toBeLessThanOrEqual(s.tolerance);
        const ra = byPackage(a).get(p)!;
        const rb = byPackage(b).get(p)!;
        expect(rb.energyUj).toBeGreaterThan(ra.energyUj);
        expect(Math.abs(Number(rb.energyUj - ra.energyUj) - uj(rb, 0x2000))).toBeLessThanOrEqual(ujTolerance(rb, s));
      }
    });

    test('throws an EnergyReadError when its input is gone instead of returning a partial reading, and reads again once it is back', () => {
      const s = fresh();
      s.breakIt(); // before any read: an MSR fd once open outlives its file's name
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
      const a = s.source.read();
      expect([...counters(a).keys()].sort((x, y) => x - y)).toEqual(s.packages);
      s.advance(500);
      const b = s.source.read();
      const ca = counters(a);
      const cb = counters(b);
      for (const p of s.packages) expect(Math.abs(delta(ca.get(p)!, cb.get(p)!) - 500)).toBeLessThanOrEqual(s.tolerance);
      for (const [p, r] of byPackage(b)) expect(r.energyUj).toBeGreaterThan(byPackage(a).get(p)!.energyUj);
    });

    test('close() can be called twice', () => {
      const s = fresh();
      s.source.read();
      s.source.close();
      expect(() => s.source.close()).not.toThrow();
    });
  });
}
