/** A data block read from a statistics file, as named values (the reader's side). Pure. */
import { statsScale, statsTypeName, statsUnitName } from './flags.js';
import type { PlacedDescriptor, StatsLayout } from './layout.js';

/** One descriptor's values from `data` (the data block's bytes, as read). */
export function descriptorValues(d: PlacedDescriptor, data: Buffer): bigint[] {
  const out: bigint[] = new Array<bigint>(d.size);
  for (let i = 0; i < d.size; i++) out[i] = data.readBigUInt64LE(d.offset + 8 * i);
  return out;
}

/** Every descriptor's values, by name. */
export function decodeStatsValues(layout: StatsLayout, data: Buffer): Map<string, bigint[]> {
  const out = new Map<string, bigint[]>();
  for (const d of layout.descriptors) out.set(d.name, descriptorValues(d, data));
  return out;
}

/** A descriptor in words: "energy[2] cumulative J x1e-6". */
export function describeDescriptor(d: PlacedDescriptor): string {
  const unit = statsUnitName(d.flags);
  const scale = d.exponent === 0 ? '' : ` x${statsScale(d.flags, d.exponent) === 10 ** d.exponent ? `1e${d.exponent}` : `2^${d.exponent}`}`;
  return `${d.name}${d.size > 1 ? `[${d.size}]` : ''} ${statsTypeName(d.flags)}${unit ? ` ${unit}` : ''}${scale}`;
}
