/** QEMU's rapl-helper-socket format, pure: 12-byte requests however the stream was cut; little-endian (QEMU writes x86 order raw). */
const LEGACY_REQUEST_SIZE = 12;
export const LEGACY_REPLY_SIZE = 8;

/** "VMS2": the first 4 bytes of a v2 connection (u32 0x32534D56 little-endian). */
export const V2_MAGIC: Buffer = Buffer.from([0x56, 0x4d, 0x53, 0x32]);

export interface LegacyRequest {
  msr: number;
  cpu: number;
  tid: number;
}

const EMPTY = Buffer.alloc(0);

/** Reassembles requests from arbitrary chunks: a request split across reads, or many in one. */
export class LegacyFramer {
  private pending: Buffer = EMPTY;

  /** Every complete request in `chunk` (plus what was left over), in order. */
  push(chunk: Buffer): LegacyRequest[] {
    const data = this.pending.length === 0 ? chunk : Buffer.concat([this.pending, chunk]);
    const count = Math.floor(data.length / LEGACY_REQUEST_SIZE);
    const out: LegacyRequest[] = new Array(count);
    for (let i = 0; i < count; i++) {
      const o = i * LEGACY_REQUEST_SIZE;
      out[i] = { msr: data.readUInt32LE(o), cpu: data.readUInt32LE(o + 4), tid: data.readUInt32LE(o + 8) };
    }
    // Copy the tail so a small remainder never pins a large chunk in memory.
    const rest = data.length - count * LEGACY_REQUEST_SIZE;
    this.pending = rest === 0 ? EMPTY : Buffer.from(data.subarray(data.length - rest));
    return out;
  }

  /** The bytes of an incomplete request waiting for the rest (a restart hands them to the next process; not copied). */
  get incomplete(): Buffer {
    return this.pending;
  }
}

export function encodeLegacyRequest(req: LegacyRequest): Buffer {
  const b = Buffer.alloc(LEGACY_REQUEST_SIZE);
  b.writeUInt32LE(req.msr >>> 0, 0);
  b.writeUInt32LE(req.cpu >>> 0, 4);
  b.writeUInt32LE(req.tid >>> 0, 8);
  return b;
}

type Preamble = 'need-more' | 'v2' | 'legacy';

/** The first 4 bytes of a connection decide its protocol; fewer than 4 cannot decide yet. */
export function classifyPreamble(head: Buffer): Preamble {
  if (head.length < V2_MAGIC.length) {
    // A prefix that already differs from the magic is legacy without waiting for more.
    return V2_MAGIC.subarray(0, head.length).equals(head) ? 'need-more' : 'legacy';
  }
  return head.subarray(0, V2_MAGIC.length).equals(V2_MAGIC) ? 'v2' : 'legacy';
}
