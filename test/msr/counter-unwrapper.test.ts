/** Energy that never goes back, from counters that wrap: RAPL's 32-bit MSR counts and powercap's energy_uj. */
import { describe, expect, test } from 'vitest';
import { CounterUnwrapper, countsToUj } from '../../src/energy/counter-unwrapper.js';

const msr = (raw: bigint) => ({ raw, range: 1n << 32n, unitJ: 2 ** -14 });
/** A powercap zone as the kernel shows it: energy_uj wrapping after max_energy_range_uj (here a real host's). */
const MAX_ENERGY_RANGE_UJ = 262143328850n;
const powercap = (energyUj: bigint) => ({ raw: energyUj, range: MAX_ENERGY_RANGE_UJ + 1n, unitJ: 1e-6 });

describe('countsToUj', () => {
  test('is exact for power-of-two units, whatever the count', () => {
    expect(countsToUj(16384n, 2 ** -14)).toBe(1_000_000n); // 1 J
    expect(countsToUj(1n, 2 ** -14)).toBe(61n); // 61.03 uJ, floored
    expect(countsToUj((1n << 60n) + 1n, 2 ** -16)).toBe((((1n << 60n) + 1n) * 1_000_000n) >> 16n);
  });

  test('is the count itself for a counter in uJ, and floors any other unit', () => {
    expect(countsToUj(123_456_789_012_345n, 1e-6)).toBe(123_456_789_012_345n);
    expect(countsToUj(3n, 1e-3)).toBe(3000n);
  });
});

describe('CounterUnwrapper', () => {
  test('starts at the counted bits of the first value (reserved bits 63:32 of an MSR ignored)', () => {
    const u = new CounterUnwrapper();
    expect(u.advance('package 0', msr(0xdead_0000_0000_0010n))).toBe(0x10n);
  });

  test('adds the distance between readings, and the range at a wrap, per key', () => {
    const u = new CounterUnwrapper();
    u.advance('package 0', msr(0xffff_fff0n));
    u.advance('package 1', msr(5n));
    expect(u.advance('package 0', msr(0xffff_fff0n))).toBe(0xffff_fff0n); // nothing used
    expect(u.advance('package 0', msr(0x10n))).toBe(0xffff_fff0n + 0x20n); // wrapped
    expect(u.advance('package 1', msr(7n))).toBe(7n);
    expect(u.energyUj('package 1', msr(16391n))).toBe(1_000_000n + countsToUj(7n, 2 ** -14));
  });

  test('a powercap energy_uj wraps after max_energy_range_uj, not at 2^32', () => {
    const u = new CounterUnwrapper();
    expect(u.energyUj('intel-rapl:0', powercap(1_000n))).toBe(1_000n);
    expect(u.energyUj('intel-rapl:0', powercap(5_000_000_000n))).toBe(5_000_000_000n); // past 2^32: no wrap
    expect(u.energyUj('intel-rapl:0', powercap(MAX_ENERGY_RANGE_UJ - 100n))).toBe(MAX_ENERGY_RANGE_UJ - 100n);
    expect(u.energyUj('intel-rapl:0', powercap(50n))).toBe(MAX_ENERGY_RANGE_UJ + 1n + 50n); // wrapped once: 151 uJ more
  });
});
