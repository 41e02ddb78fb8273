/** THE names of the energy sources: a new source is one more name here and one more entry in create.ts's table. */
export const ENERGY_SOURCE_KINDS = ['msr', 'powercap', 'synthetic'] as const;

export type EnergySourceKind = (typeof ENERGY_SOURCE_KINDS)[number];

/** What --energy-source takes: a kind, or `auto` (choose.ts: the MSRs when they open, else powercap). */
export const ENERGY_SOURCE_CHOICES = ['auto', ...ENERGY_SOURCE_KINDS] as const;

export type EnergySourceChoice = (typeof ENERGY_SOURCE_CHOICES)[number];

/** What a command (the daemon, record) uses when not told. */
export const DEFAULT_ENERGY_SOURCE: EnergySourceChoice = 'auto';

/** The kind a service chain is built with when its caller names none (tests and the bench on MSR files). */
export const DEFAULT_CHAIN_ENERGY_SOURCE: EnergySourceKind = 'msr';

/** Each kind's number in the host statistics file's `energy_source` (docs/stats-fd.md; 0: not stated). Never renumbered. */
export const ENERGY_SOURCE_CODE: { readonly [K in EnergySourceKind]: number } = { msr: 1, powercap: 2, synthetic: 3 };

/** The kind of a code as a file gives it, or null for 0, absent, and any code this version does not know. */
export function energySourceOfCode(code: bigint | number | undefined): EnergySourceKind | null {
  if (code === undefined || (typeof code === 'number' && !Number.isInteger(code))) return null;
  const c = BigInt(code);
  return ENERGY_SOURCE_KINDS.find((k) => BigInt(ENERGY_SOURCE_CODE[k]) === c) ?? null;
}

export function isEnergySourceKind(text: unknown): text is EnergySourceKind {
  return (ENERGY_SOURCE_KINDS as readonly unknown[]).includes(text);
}
