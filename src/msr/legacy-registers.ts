/** The host register for a legacy (Intel-numbered) request; AMD's power limit and info are made up (QEMU refuses RAPL at 0). */
import {
  LEGACY_ALLOWED_MSRS,
  MSR_AMD_PKG_ENERGY_STATUS,
  MSR_AMD_RAPL_POWER_UNIT,
  MSR_PKG_ENERGY_STATUS,
  MSR_PKG_POWER_INFO,
  MSR_PKG_POWER_LIMIT,
  MSR_RAPL_POWER_UNIT,
} from './registers.js';
import type { Vendor } from '../model/host.js';

export interface AmdSynthConfig {
  /** Package power limit PL1 reported in MSR_PKG_POWER_LIMIT, watts. */
  powerLimitWatts: number;
  /** Thermal design power reported in MSR_PKG_POWER_INFO, watts. */
  tdpWatts: number;
}

/** Documented defaults: a typical server part; any positive value keeps QEMU's start-up check happy. */
export const DEFAULT_AMD_SYNTH: AmdSynthConfig = { powerLimitWatts: 120, tdpWatts: 120 };

export type LegacyPlan =
  | { kind: 'read'; msr: number }
  /** read the power unit register `unitMsr`, then encode `field` from configuration in that unit. */
  | { kind: 'synth'; field: 'power-limit' | 'power-info'; unitMsr: number };

/** Null for a number not allowed. */
export function legacyPlan(vendor: Vendor, msr: number): LegacyPlan | null {
  if (vendor === 'intel') return LEGACY_ALLOWED_MSRS.has(msr) ? { kind: 'read', msr } : null;
  switch (msr) {
    case MSR_RAPL_POWER_UNIT:
      return { kind: 'read', msr: MSR_AMD_RAPL_POWER_UNIT };
    case MSR_PKG_ENERGY_STATUS:
      return { kind: 'read', msr: MSR_AMD_PKG_ENERGY_STATUS };
    case MSR_PKG_POWER_LIMIT:
      return { kind: 'synth', field: 'power-limit', unitMsr: MSR_AMD_RAPL_POWER_UNIT };
    case MSR_PKG_POWER_INFO:
      return { kind: 'synth', field: 'power-info', unitMsr: MSR_AMD_RAPL_POWER_UNIT };
    default:
      return null;
  }
}

/** PL1 and its enable bit 15, or the TDP, the rest 0: watts in `powerUnitRaw`'s unit (1/2^PU W), within 1..0x7fff. */
export function synthValue(field: 'power-limit' | 'power-info', powerUnitRaw: bigint, cfg: AmdSynthConfig): bigint {
  const watts = field === 'power-limit' ? cfg.powerLimitWatts : cfg.tdpWatts;
  const units = BigInt(Math.min(0x7fff, Math.max(1, Math.round(watts * 2 ** Number(powerUnitRaw & 0xfn)))));
  return field === 'power-limit' ? units | (1n << 15n) : units;
}
