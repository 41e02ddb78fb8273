/** THE RAPL domains, in reading and attribution order (docs/energy-domains.md); the package always read; powercap's zone names. */
export const ENERGY_DOMAINS = ['package', 'core', 'uncore', 'dram', 'psys'] as const;

export type EnergyDomain = (typeof ENERGY_DOMAINS)[number];

/** Domains of the whole platform: read once, under the lowest package id, shared across every package's VMs. */
export const PLATFORM_DOMAINS: ReadonlySet<EnergyDomain> = new Set(['psys']);

export function isEnergyDomain(text: unknown): text is EnergyDomain {
  return (ENERGY_DOMAINS as readonly unknown[]).includes(text);
}

export type OtherDomain = Exclude<EnergyDomain, 'package'>;

export const OTHER_DOMAINS: readonly OtherDomain[] = ENERGY_DOMAINS.filter((d): d is OtherDomain => d !== 'package');

export function isOtherDomain(text: unknown): text is OtherDomain {
  return text !== 'package' && isEnergyDomain(text);
}
