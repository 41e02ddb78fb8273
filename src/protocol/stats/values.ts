/** A descriptor's values in a data block read from a statistics file (the reader's side). Pure. */
import type { PlacedDescriptor } from './layout.js';

/** One descriptor's values from `data` (the data block's bytes, as read). */
export function descriptorValues(d: PlacedDescriptor, data: Buffer): bigint[] {
  const out: bigint[] = new Array<bigint>(d.size);
  for (let i = 0; i < d.size; i++) out[i] = data.readBigUInt64LE(d.offset + 8 * i);
  return out;
}
