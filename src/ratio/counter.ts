/** RAPL energy counter arithmetic: the 32-bit counter, the energy status unit, hex text of MSR values. */
import type { CounterSpec, HostPackage } from '../model/host.js';

/** One counter unit is 2^-ESU joules, the energy status unit being bits 12:8 of MSR_RAPL_POWER_UNIT. */
export function joulesPerCounterUnit(powerUnit: bigint): number {
  return 2 ** -Number((powerUnit >> 8n) & 0x1fn);
}

/** A RAPL energy counter counts 2^32 values (bits 31:0), then wraps to 0. */
export const RAPL_COUNTER_RANGE = 1n << 32n;

/** THE counter of a package: as host info describes it, else a RAPL MSR's (2^32 counts of the ESU). */
export function packageCounter(p: HostPackage): CounterSpec {
  return p.counter ?? { range: RAPL_COUNTER_RANGE, unitJ: joulesPerCounterUnit(p.powerUnit) };
}

/** The MSR-format counter of `j` joules at `unitJ` J a count: floor(j / unitJ) mod 2^32 (VpkgOutput.counter). */
export function counterOfJoules(j: number, unitJ: number): number {
  return Math.floor(j / unitJ) % 2 ** 32;
}

/** Only bits 31:0 of MSR_PKG_ENERGY_STATUS count; the rest is reserved. */
export function energyCounterBits(raw: bigint): number {
  return Number(raw & 0xffffffffn);
}

export function formatMsrHex(value: bigint | number): string {
  return `0x${value.toString(16)}`;
}

/** Parses "0x..." hex strings (trace files, config); throws with the offending text otherwise. */
export function parseMsrHex(text: unknown, what: string): bigint {
  if (typeof text !== 'string' || !/^0x[0-9a-fA-F]{1,16}$/.test(text)) {
    throw new Error(`${what}: expected a hex string like "0x1a2b" (at most 64 bits), got ${JSON.stringify(text)}`);
  }
  return BigInt(text);
}
