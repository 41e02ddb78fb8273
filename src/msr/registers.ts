/** MSR numbers and the bit layouts this project relies on. */

export const MSR_RAPL_POWER_UNIT = 0x606;
export const MSR_PKG_POWER_LIMIT = 0x610;
export const MSR_PKG_ENERGY_STATUS = 0x611;
export const MSR_PKG_POWER_INFO = 0x614;

/** AMD family 17h+ equivalents (Intel layout for the fields we use). */
export const MSR_AMD_RAPL_POWER_UNIT = 0xc0010299;
export const MSR_AMD_CORE_ENERGY_STATUS = 0xc001029a;
export const MSR_AMD_PKG_ENERGY_STATUS = 0xc001029b;

/** The only MSRs a legacy (QEMU) client may ask for. */
export const LEGACY_ALLOWED_MSRS: ReadonlySet<number> = new Set([
  MSR_RAPL_POWER_UNIT,
  MSR_PKG_POWER_LIMIT,
  MSR_PKG_ENERGY_STATUS,
  MSR_PKG_POWER_INFO,
]);

export type Vendor = 'intel' | 'amd';

/** Energy status unit (bits 12:8 of MSR_RAPL_POWER_UNIT): one counter unit is 2^-ESU joules. */
export function energyStatusUnitBits(powerUnit: bigint): number {
  return Number((powerUnit >> 8n) & 0x1fn);
}

export function joulesPerCounterUnit(powerUnit: bigint): number {
  return 2 ** -energyStatusUnitBits(powerUnit);
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
