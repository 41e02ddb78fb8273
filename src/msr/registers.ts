/** MSR numbers and the bit layouts this project relies on. */
import type { Vendor } from '../model/host.js';

export const MSR_RAPL_POWER_UNIT = 0x606;
export const MSR_PKG_POWER_LIMIT = 0x610;
export const MSR_PKG_ENERGY_STATUS = 0x611;
export const MSR_PKG_POWER_INFO = 0x614;
/** The other RAPL energy status registers (Intel SDM vol. 4): bits 31:0 count, like 0x611. */
export const MSR_DRAM_ENERGY_STATUS = 0x619;
export const MSR_PP0_ENERGY_STATUS = 0x639;
export const MSR_PP1_ENERGY_STATUS = 0x641;
export const MSR_PLATFORM_ENERGY_STATUS = 0x64d;

/** AMD family 17h+ equivalents (Intel layout for the fields we use). */
export const MSR_AMD_RAPL_POWER_UNIT = 0xc0010299;
export const MSR_AMD_CORE_ENERGY_STATUS = 0xc001029a;
export const MSR_AMD_PKG_ENERGY_STATUS = 0xc001029b;

/** What each register read here is, for messages that name a missing one. */
const MSR_NAMES: ReadonlyMap<number, string> = new Map([
  [MSR_RAPL_POWER_UNIT, 'Intel RAPL power unit'],
  [MSR_PKG_POWER_LIMIT, 'Intel package power limit'],
  [MSR_PKG_ENERGY_STATUS, 'Intel package energy status'],
  [MSR_PKG_POWER_INFO, 'Intel package power info'],
  [MSR_DRAM_ENERGY_STATUS, 'Intel DRAM energy status'],
  [MSR_PP0_ENERGY_STATUS, 'Intel core (PP0) energy status'],
  [MSR_PP1_ENERGY_STATUS, 'Intel uncore (PP1) energy status'],
  [MSR_PLATFORM_ENERGY_STATUS, 'Intel platform (PSYS) energy status'],
  [MSR_AMD_RAPL_POWER_UNIT, 'AMD RAPL power unit'],
  [MSR_AMD_CORE_ENERGY_STATUS, 'AMD core energy status'],
  [MSR_AMD_PKG_ENERGY_STATUS, 'AMD package energy status'],
]);

/** `MSR 0xc0010299 (AMD RAPL power unit)`, or `MSR 0x...` for a register without a name here. */
export function describeMsr(msr: number): string {
  const name = MSR_NAMES.get(msr);
  return `MSR 0x${msr.toString(16)}${name === undefined ? '' : ` (${name})`}`;
}

/** The only MSRs a legacy (QEMU) client may ask for. */
export const LEGACY_ALLOWED_MSRS: ReadonlySet<number> = new Set([
  MSR_RAPL_POWER_UNIT,
  MSR_PKG_POWER_LIMIT,
  MSR_PKG_ENERGY_STATUS,
  MSR_PKG_POWER_INFO,
]);

/** The register whose bits 12:8 give a vendor's energy status unit (Intel 0x606, AMD 0xC0010299). */
export function powerUnitMsr(vendor: Vendor): number {
  return vendor === 'amd' ? MSR_AMD_RAPL_POWER_UNIT : MSR_RAPL_POWER_UNIT;
}
