/** Descriptor flags (docs/stats-fd.md "Flags"): KVM's codes (api.rst, KVM_GET_STATS_FD), the helper's own for energy and power. */

const STATS_TYPE_SHIFT = 0;
export const STATS_TYPE_MASK = 0xf << STATS_TYPE_SHIFT;
const STATS_UNIT_SHIFT = 4;
export const STATS_UNIT_MASK = 0xf << STATS_UNIT_SHIFT;
const STATS_BASE_SHIFT = 8;
export const STATS_BASE_MASK = 0xf << STATS_BASE_SHIFT;

/** KVM_STATS_TYPE_*: only grows (CUMULATIVE), goes up and down (INSTANT), the highest seen (PEAK). */
export const STATS_TYPE = {
  CUMULATIVE: 0x0 << STATS_TYPE_SHIFT,
  INSTANT: 0x1 << STATS_TYPE_SHIFT,
  PEAK: 0x2 << STATS_TYPE_SHIFT,
} as const;

/** KVM_STATS_UNIT_*; JOULES and WATTS from the top of the range, so a unit KVM adds later (as BOOLEAN was) cannot collide. */
export const STATS_UNIT = {
  NONE: 0x0 << STATS_UNIT_SHIFT,
  BYTES: 0x1 << STATS_UNIT_SHIFT,
  SECONDS: 0x2 << STATS_UNIT_SHIFT,
  CYCLES: 0x3 << STATS_UNIT_SHIFT,
  BOOLEAN: 0x4 << STATS_UNIT_SHIFT,
  JOULES: 0x8 << STATS_UNIT_SHIFT,
  WATTS: 0x9 << STATS_UNIT_SHIFT,
} as const;

/** KVM_STATS_BASE_*: the exponent is a power of 10 or of 2. */
export const STATS_BASE = {
  POW10: 0x0 << STATS_BASE_SHIFT,
  POW2: 0x1 << STATS_BASE_SHIFT,
} as const;

/** The factor a raw value is multiplied by to get the unit: 10^exponent or 2^exponent. */
export function statsScale(flags: number, exponent: number): number {
  return (flags & STATS_BASE_MASK) === STATS_BASE.POW2 ? 2 ** exponent : 10 ** exponent;
}
