/**
 * THE RAPL domains, in the order a source reads them and the engine attributes them
 * (docs/energy-domains.md). The package is always read. Powercap's zone names are the same words.
 */
export const ENERGY_DOMAINS = ['package', 'core', 'uncore', 'dram', 'psys'] as const;

export type EnergyDomain = (typeof ENERGY_DOMAINS)[number];

/**
 * Domains that count the whole platform rather than one package: a source gives one reading of
 * them, under its lowest package id, and the engine shares them across every package's VMs.
 */
export const PLATFORM_DOMAINS: ReadonlySet<EnergyDomain> = new Set(['psys']);

export function isEnergyDomain(text: unknown): text is EnergyDomain {
  return (ENERGY_DOMAINS as readonly unknown[]).includes(text);
}

export type OtherDomain = Exclude<EnergyDomain, 'package'>;

export const OTHER_DOMAINS: readonly OtherDomain[] = ENERGY_DOMAINS.filter((d): d is OtherDomain => d !== 'package');

export function isOtherDomain(text: unknown): text is OtherDomain {
  return text !== 'package' && isEnergyDomain(text);
}
