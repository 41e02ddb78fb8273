/** Turns a wrapping energy counter into energy that never goes back (EnergyReading.energyUj). */
import type { EnergyCounter } from './energy-source.js';

/** Exact µJ of `counts` counts: shifts for a power-of-two unit (RAPL's 2^-ESU J), else floor(counts x unit). */
export function countsToUj(counts: bigint, unitJ: number): bigint {
  const esu = -Math.log2(unitJ);
  if (Number.isInteger(esu) && esu >= 0) return (counts * 1_000_000n) >> BigInt(esu);
  if (unitJ === 1e-6) return counts;
  return BigInt(Math.floor(Number(counts) * unitJ * 1e6));
}

/** Per counter (by a key: "package 0"), counts since its zero: its first value, then each distance mod the range (read once per wrap). */
export class CounterUnwrapper {
  private readonly last = new Map<string, { counted: bigint; total: bigint }>();

  /** Takes the counter's value now; returns the counts so far. */
  advance(key: string, counter: EnergyCounter): bigint {
    const counted = counter.raw % counter.range;
    const prev = this.last.get(key);
    if (prev === undefined) {
      this.last.set(key, { counted, total: counted });
      return counted;
    }
    // Updated in place: every counter is read every interval.
    prev.total += (counted - prev.counted + counter.range) % counter.range;
    prev.counted = counted;
    return prev.total;
  }

  /** energyUj of a reading of `counter` under `key` (counts so far in µJ). */
  energyUj(key: string, counter: EnergyCounter): bigint {
    return countsToUj(this.advance(key, counter), counter.unitJ);
  }
}
