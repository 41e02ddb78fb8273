/**
 * THE names of the energy sources: every option, type and table of sources takes them from here, so a
 * new source (issue 19: powercap, more RAPL domains) is one more name here and one more entry in the
 * table of create.ts, which the compiler then asks for.
 */
export const ENERGY_SOURCE_KINDS = ['msr', 'powercap', 'synthetic'] as const;

export type EnergySourceKind = (typeof ENERGY_SOURCE_KINDS)[number];

/** What a command uses when it is not told: the RAPL MSRs. */
export const DEFAULT_ENERGY_SOURCE: EnergySourceKind = 'msr';

export function isEnergySourceKind(text: unknown): text is EnergySourceKind {
  return (ENERGY_SOURCE_KINDS as readonly unknown[]).includes(text);
}
