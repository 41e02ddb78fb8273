/** A statistics file's values by name and its descriptors in words, as tests read them (src/protocol/stats/). */
import { STATS_TYPE, STATS_TYPE_MASK, STATS_UNIT, STATS_UNIT_MASK, statsScale } from '../../src/protocol/stats/flags.js';
import type { PlacedDescriptor, StatsLayout } from '../../src/protocol/stats/layout.js';
import { descriptorValues } from '../../src/protocol/stats/values.js';

/** Every descriptor's values, by name. */
export function decodeStatsValues(layout: StatsLayout, data: Buffer): Map<string, bigint[]> {
  return new Map(layout.descriptors.map((d) => [d.name, descriptorValues(d, data)]));
}

const TYPE_NAMES: Readonly<Record<number, string>> = {
  [STATS_TYPE.CUMULATIVE]: 'cumulative',
  [STATS_TYPE.INSTANT]: 'instant',
  [STATS_TYPE.PEAK]: 'peak',
};
const UNIT_NAMES: Readonly<Record<number, string>> = {
  [STATS_UNIT.NONE]: '',
  [STATS_UNIT.BYTES]: 'B',
  [STATS_UNIT.SECONDS]: 's',
  [STATS_UNIT.CYCLES]: 'cycles',
  [STATS_UNIT.BOOLEAN]: 'bool',
  [STATS_UNIT.JOULES]: 'J',
  [STATS_UNIT.WATTS]: 'W',
};

/** A descriptor in words: "energy[2] cumulative J x1e-6" (an unknown type or unit by its code). */
export function describeDescriptor(d: PlacedDescriptor): string {
  const type = TYPE_NAMES[d.flags & STATS_TYPE_MASK] ?? `type ${d.flags & STATS_TYPE_MASK}`;
  const unit = UNIT_NAMES[d.flags & STATS_UNIT_MASK] ?? `unit ${(d.flags & STATS_UNIT_MASK) >> 4}`;
  const scale = d.exponent === 0 ? '' : ` x${statsScale(d.flags, d.exponent) === 10 ** d.exponent ? `1e${d.exponent}` : `2^${d.exponent}`}`;
  return `${d.name}${d.size > 1 ? `[${d.size}]` : ''} ${type}${unit ? ` ${unit}` : ''}${scale}`;
}
