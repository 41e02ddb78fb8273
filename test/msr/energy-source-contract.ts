/**
 * THE contract every EnergySource keeps, as one suite run against each implementation (as hono runs
 * one suite over every router): the packages it names, a reading per package and nothing else,
 * 32-bit counters that move by exactly the energy used (wrapping like the hardware's), a failure
 * that throws instead of giving a partial reading, and recovery once the cause is gone.
 */
import { afterEach, describe, expect, test } from 'vitest';
import type { EnergySource } from '../../src/msr/energy-source.js';

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
      expect([...s.source.read().keys()].sort((a, b) => a - b)).toEqual(s.packages);
    });

    test('counters are 32-bit values (bits 31:0 of a u64) that start where the host left them', () => {
      const s = fresh();
      for (const v of s.source.read().values()) {
        expect(typeof v).toBe('bigint');
        expect(v >= 0n && v < 1n << 64n).toBe(true);
        expect(Math.abs(delta(BigInt(START_COUNTER), v & 0xffffffffn))).toBeLessThanOrEqual(s.tolerance);
      }
    });

    test('moves by exactly the energy used, and not at all when none is', () => {
      const s = fresh();
      const a = s.source.read();
      const still = s.source.read();
      for (const p of s.packages) expect(delta(a.get(p)!, still.get(p)!)).toBeLessThanOrEqual(s.tolerance);
      s.advance(1000);
      const b = s.source.read();
      for (const p of s.packages) expect(Math.abs(delta(still.get(p)!, b.get(p)!) - 1000)).toBeLessThanOrEqual(s.tolerance);
    });

    test('wraps at 2^32 like the hardware counter', () => {
      const s = fresh();
      const a = s.source.read();
      s.advance(0x2000); // START_COUNTER + 0x2000 is past 2^32
      const b = s.source.read();
      for (const p of s.packages) {
        expect(b.get(p)! & 0xffffffffn).toBeLessThan(a.get(p)! & 0xffffffffn);
        expect(Math.abs(delta(a.get(p)!, b.get(p)!) - 0x2000)).toBeLessThanOrEqual(s.tolerance);
      }
    });

    test('throws when its input is gone instead of returning a partial reading, and reads again once it is back', () => {
      const s = fresh();
      s.breakIt();
      expect(() => s.source.read()).toThrow();
      s.repair();
      const a = s.source.read();
      expect([...a.keys()].sort((x, y) => x - y)).toEqual(s.packages);
      s.advance(500);
      const b = s.source.read();
      for (const p of s.packages) expect(Math.abs(delta(a.get(p)!, b.get(p)!) - 500)).toBeLessThanOrEqual(s.tolerance);
    });

    test('close() can be called twice', () => {
      const s = fresh();
      s.source.read();
      s.source.close();
      expect(() => s.source.close()).not.toThrow();
    });
  });
}
