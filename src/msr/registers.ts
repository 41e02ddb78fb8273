/** MSR numbers and the bit layouts this project relies on. */
import type { Vendor } from '../ratio/types.js';

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

/** The only MSRs a legacy (QEMU) client may ask for. */
export const LEGACY_ALLOWED_MSRS: ReadonlySet<number> = new Set([
  MSR_RAPL_POWER_UNIT,
  MSR_PKG_POWER_LIMIT,
  MSR_PKG_ENERGY_STATUS,
  MSR_PKG_POWER_INFO,
]);

/** The package energy counter of a vendor (Intel 0x611, AMD 0xC001029B). */
export function packageEnergyMsr(vendor: Vendor): number {
  return vendor === 'amd' ? MSR_AMD_PKG_ENERGY_STATUS : MSR_PKG_ENERGY_STATUS;
}

/** The register whose bits 12:8 give a vendor's energy status unit (Intel 0x606, AMD 0xC0010299). */
export function powerUnitMsr(vendor: Vendor): number {
  return vendor === 'amd' ? MSR_AMD_RAPL_POWER_UNIT : MSR_RAPL_POWER_UNIT;
}
