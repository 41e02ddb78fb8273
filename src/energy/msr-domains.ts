/** THE table of RAPL domains in MSRs: per vendor, each domain's register, what it covers and its unit (docs/energy-domains.md). */
import type { CpuModel } from '../msr/vendor.js';
import {
  MSR_AMD_CORE_ENERGY_STATUS,
  MSR_AMD_PKG_ENERGY_STATUS,
  MSR_DRAM_ENERGY_STATUS,
  MSR_PKG_ENERGY_STATUS,
  MSR_PLATFORM_ENERGY_STATUS,
  MSR_PP0_ENERGY_STATUS,
  MSR_PP1_ENERGY_STATUS,
} from '../msr/registers.js';
import type { Vendor } from '../model/host.js';
import type { EnergyDomain } from './energy-source.js';

/** package: one register per package; core: one per physical core (summed per package); platform: one for the host. */
export type RegisterScope = 'package' | 'core' | 'platform';

interface MsrDomainRegister {
  msr: number;
  scope: RegisterScope;
}

export const MSR_DOMAINS: { readonly [V in Vendor]: Partial<Readonly<Record<EnergyDomain, MsrDomainRegister>>> } = {
  intel: {
    package: { msr: MSR_PKG_ENERGY_STATUS, scope: 'package' },
    core: { msr: MSR_PP0_ENERGY_STATUS, scope: 'package' },
    uncore: { msr: MSR_PP1_ENERGY_STATUS, scope: 'package' },
    dram: { msr: MSR_DRAM_ENERGY_STATUS, scope: 'package' },
    psys: { msr: MSR_PLATFORM_ENERGY_STATUS, scope: 'platform' },
  },
  amd: {
    package: { msr: MSR_AMD_PKG_ENERGY_STATUS, scope: 'package' },
    core: { msr: MSR_AMD_CORE_ENERGY_STATUS, scope: 'core' },
  },
};

/** Intel family 6 models whose DRAM counts in 15.3 µJ, not the ESU (Linux's rapl_defaults_hsw_server; SPR/EMR not since 6.1). */
const DRAM_FIXED_UNIT_MODELS: ReadonlyMap<number, string> = new Map([
  [0x3f, 'Haswell-X'],
  [0x4f, 'Broadwell-X'],
  [0x55, 'Skylake-X, Cascade Lake-X, Cooper Lake-X'],
  [0x57, 'Xeon Phi Knights Landing'],
  [0x6a, 'Ice Lake-X'],
  [0x6c, 'Ice Lake-D'],
  [0x85, 'Xeon Phi Knights Mill'],
]);

/** The DRAM unit of DRAM_FIXED_UNIT_MODELS: 15.3 µJ (Linux's 15300 pJ; about 2^-16 J). */
export const DRAM_FIXED_UNIT_J = 15.3e-6;

/** Intel models whose PSYS counter counts whole joules (Linux's rapl_defaults_spr_server, psys unit 1 J). */
const PSYS_JOULE_UNIT_MODELS: ReadonlyMap<number, string> = new Map([
  [0x8f, 'Sapphire Rapids-X'],
  [0xcf, 'Emerald Rapids-X'],
]);

/** Joules per count of `domain` on this CPU, given the ESU unit of its power unit register. */
export function domainUnitJ(vendor: Vendor, domain: EnergyDomain, esuUnitJ: number, model: CpuModel | undefined): number {
  const intel6 = vendor === 'intel' && model?.family === 6;
  if (domain === 'dram' && intel6 && DRAM_FIXED_UNIT_MODELS.has(model.model)) return DRAM_FIXED_UNIT_J;
  if (domain === 'psys' && intel6 && PSYS_JOULE_UNIT_MODELS.has(model.model)) return 1;
  return esuUnitJ;
}
