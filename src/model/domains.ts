/**
 * THE RAPL domains, in the order a source reads them and the engine attributes them
 * (docs/energy-domains.md): the package (always read: the engine and QEMU's requests work on it), its
 * cores (Intel PP0; on AMD the sum of the package's per-core counters), the uncore/graphics plane
 * (PP1), DRAM, and the platform (PSYS). Powercap's zone names are the same words (package-N, core,
 * uncore, dram, psys). Pure data: energy sources, traces, the engine and every output take them from here.
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

/** Every domain but the package: the ones a host may have or not, attributed beside the package. */
export type OtherDomain = Exclude<EnergyDomain, 'package'>;

/** The other domains, in ENERGY_DOMAINS order (what a message lists as the names allowed). */
export const OTHER_DOMAINS: readonly OtherDomain[] = ENERGY_DOMAINS.filter((d): d is OtherDomain => d !== 'package');

export function isOtherDomain(text: unknown): text is OtherDomain {
  return text !== 'package' && isEnergyDomain(text);
}
