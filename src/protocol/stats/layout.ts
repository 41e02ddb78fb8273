/** The statistics file's layout (docs/stats-fd.md), KVM's: encoded new (values 0), decoded as hostile input. Pure. */
import { fail, ok, type Result } from '../../common/result.js';
import { readFields, utf8Cut, writeFields } from '../v2/codec.js';
import { MAX_VCPUS } from '../../model/vcpus.js';
import { STATS_BASE_MASK, STATS_TYPE_MASK, STATS_UNIT_MASK } from './flags.js';

/** The header's fields, in file order (STATS_HEADER_SIZE bytes). */
const STATS_HEADER = { flags: 'u32', nameSize: 'u32', numDesc: 'u32', idOffset: 'u32', descOffset: 'u32', dataOffset: 'u32' } as const;
const STATS_HEADER_SIZE = 24;
/** Bytes of every name and of the id string, trailing NUL included (the header's name_size). */
const STATS_NAME_SIZE = 64;
/** Fixed part of a descriptor, before its name. */
const STATS_DESC_FIXED = 16;
const STATS_HEADER_FLAGS = 0;
/** Bounds a reader holds a file to (and the helper never passes). */
const MAX_STATS_DESCRIPTORS = 256;
const MAX_STATS_NAME_SIZE = 256;
export const MAX_STATS_FILE_BYTES = 1 << 20;
/** Values one array descriptor may hold: the most vCPUs a VM may have (more than any other array needs). */
const MAX_STATS_ARRAY = MAX_VCPUS;

export interface StatsDescriptor {
  name: string;
  /** STATS_TYPE | STATS_UNIT | STATS_BASE. */
  flags: number;
  exponent: number;
  /** Values (u64) it holds: 1, or one per virtual package, vCPU, host package. */
  size: number;
}

export interface PlacedDescriptor extends StatsDescriptor {
  /** Byte offset of its first value in the data block. */
  offset: number;
}

export interface StatsLayout {
  id: string;
  nameSize: number;
  descriptors: PlacedDescriptor[];
  idOffset: number;
  descOffset: number;
  dataOffset: number;
  dataSize: number;
  /** dataOffset + dataSize. */
  fileSize: number;
}

const align8 = (n: number): number => (n + 7) & ~7;

/** Where everything goes, values packed in descriptor order. Throws on a bad declaration. */
export function planStatsLayout(id: string, descs: readonly StatsDescriptor[]): StatsLayout {
  if (descs.length === 0 || descs.length > MAX_STATS_DESCRIPTORS)
    throw new RangeError(`stats: ${descs.length} descriptors, 1..${MAX_STATS_DESCRIPTORS} allowed`);
  const nameSize = STATS_NAME_SIZE;
  const names = new Set<string>();
  let offset = 0;
  const placed: PlacedDescriptor[] = descs.map((d) => {
    if (Buffer.byteLength(d.name) >= nameSize || d.name.length === 0)
      throw new RangeError(`stats: name "${d.name}" must be 1..${nameSize - 1} bytes`);
    if (names.has(d.name)) throw new RangeError(`stats: name "${d.name}" is declared twice`);
    names.add(d.name);
    if (!Number.isInteger(d.size) || d.size < 1 || d.size > MAX_STATS_ARRAY)
      throw new RangeError(`stats: ${d.name} has size ${d.size}, 1..${MAX_STATS_ARRAY} allowed`);
    if (!Number.isInteger(d.exponent) || d.exponent < -32768 || d.exponent > 32767)
      throw new RangeError(`stats: ${d.name} has exponent ${d.exponent}`);
    const p = { ...d, offset };
    offset += 8 * d.size;
    return p;
  });
  const idOffset = STATS_HEADER_SIZE;
  const descOffset = align8(idOffset + nameSize);
  const dataOffset = align8(descOffset + placed.length * (STATS_DESC_FIXED + nameSize));
  const fileSize = dataOffset + offset;
  if (fileSize > MAX_STATS_FILE_BYTES) throw new RangeError(`stats: a file of ${fileSize} bytes is over ${MAX_STATS_FILE_BYTES}`);
  return { id, nameSize, descriptors: placed, idOffset, descOffset, dataOffset, dataSize: offset, fileSize };
}

/** The whole file, every value 0; the id string cut to fit name_size with its NUL. */
export function encodeStatsFile(layout: StatsLayout): Buffer {
  const b = Buffer.alloc(layout.fileSize);
  writeFields(b, 0, STATS_HEADER, { ...layout, flags: STATS_HEADER_FLAGS, numDesc: layout.descriptors.length });
  utf8Cut(layout.id, layout.nameSize - 1).copy(b, layout.idOffset);
  layout.descriptors.forEach((d, i) => {
    const o = layout.descOffset + i * (STATS_DESC_FIXED + layout.nameSize);
    b.writeUInt32LE(d.flags, o);
    b.writeInt16LE(d.exponent, o + 4);
    b.writeUInt16LE(d.size, o + 6);
    b.writeUInt32LE(d.offset, o + 8);
    b.write(d.name, o + STATS_DESC_FIXED, 'utf8');
  });
  return b;
}

function decodeStatsHeader(b: Buffer) {
  if (b.length < STATS_HEADER_SIZE) return fail(`the header is ${STATS_HEADER_SIZE} bytes, only ${b.length} were read`);
  const h = readFields(b, 0, STATS_HEADER);
  if (h.nameSize < 2 || h.nameSize > MAX_STATS_NAME_SIZE) return fail(`name_size ${h.nameSize} is not 2..${MAX_STATS_NAME_SIZE}`);
  if (h.numDesc > MAX_STATS_DESCRIPTORS) return fail(`num_desc ${h.numDesc} is over ${MAX_STATS_DESCRIPTORS}`);
  for (const k of ['idOffset', 'descOffset', 'dataOffset'] as const)
    if (h[k] % 8 !== 0) return fail(`${k.replace('Offset', '_offset')} ${h[k]} is not a multiple of 8`);
  // The blocks come in order, without overlap (api.rst): header, id, descriptors, data.
  if (h.idOffset < STATS_HEADER_SIZE) return fail(`id_offset ${h.idOffset} overlaps the header`);
  if (h.descOffset < h.idOffset + h.nameSize) return fail(`desc_offset ${h.descOffset} overlaps the id string`);
  if (h.dataOffset < h.descOffset + h.numDesc * (STATS_DESC_FIXED + h.nameSize))
    return fail(`data_offset ${h.dataOffset} overlaps the descriptors`);
  if (h.dataOffset > MAX_STATS_FILE_BYTES) return fail(`data_offset ${h.dataOffset} is over ${MAX_STATS_FILE_BYTES}`);
  return ok(h);
}

/** A NUL-terminated string in `b` of at most `size` bytes; refused without its NUL. */
function cString(b: Buffer, at: number, size: number, what: string): Result<string> {
  const end = b.indexOf(0, at);
  if (end < 0 || end >= at + size) return fail(`${what} is not NUL-terminated within ${size} bytes`);
  return ok(b.toString('utf8', at, end));
}

/** A file's layout from its bytes up to data_offset and its size, every offset checked (docs/stats-fd.md "Reading it"). */
export function decodeStatsLayout(b: Buffer, fileSize: number): Result<StatsLayout> {
  const hr = decodeStatsHeader(b);
  if (!hr.ok) return hr;
  const h = hr.value;
  if (b.length < h.dataOffset) return fail(`the descriptors end at ${h.dataOffset}, only ${b.length} bytes were read`);
  if (fileSize < h.dataOffset || fileSize > MAX_STATS_FILE_BYTES)
    return fail(`file size ${fileSize} is not ${h.dataOffset}..${MAX_STATS_FILE_BYTES}`);
  const id = cString(b, h.idOffset, h.nameSize, 'the id string');
  if (!id.ok) return id;
  const dataSize = fileSize - h.dataOffset;
  const descriptors: PlacedDescriptor[] = [];
  const used: [number, number][] = [];
  for (let i = 0; i < h.numDesc; i++) {
    const o = h.descOffset + i * (STATS_DESC_FIXED + h.nameSize);
    const name = cString(b, o + STATS_DESC_FIXED, h.nameSize, `descriptor ${i}'s name`);
    if (!name.ok) return name;
    const d: PlacedDescriptor = {
      flags: b.readUInt32LE(o),
      exponent: b.readInt16LE(o + 4),
      size: b.readUInt16LE(o + 6),
      offset: b.readUInt32LE(o + 8),
      name: name.value,
    };
    if (d.size === 0) return fail(`descriptor ${d.name} has size 0`);
    if (d.offset % 8 !== 0) return fail(`descriptor ${d.name}: offset ${d.offset} is not a multiple of 8`);
    if (d.offset + 8 * d.size > dataSize)
      return fail(`descriptor ${d.name}: its values end at ${d.offset + 8 * d.size}, the data block has ${dataSize} bytes`);
    if ((d.flags & ~(STATS_TYPE_MASK | STATS_UNIT_MASK | STATS_BASE_MASK)) !== 0)
      return fail(`descriptor ${d.name}: flags 0x${d.flags.toString(16)} has unknown bits`);
    used.push([d.offset, d.offset + 8 * d.size]);
    descriptors.push(d);
  }
  used.sort((x, y) => x[0] - y[0]);
  for (let i = 1; i < used.length; i++)
    if (used[i]![0] < used[i - 1]![1]) return fail(`two descriptors' values overlap at byte ${used[i]![0]} of the data block`);
  const { nameSize, idOffset, descOffset, dataOffset } = h;
  return ok({ id: id.value, nameSize, descriptors, idOffset, descOffset, dataOffset, dataSize, fileSize });
}
