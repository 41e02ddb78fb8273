/** The v2 frame decoder (docs/protocol.md "v2"): never more than one frame buffered, so a hostile peer cannot grow it. Pure. */
import { fail, ok, type Result } from '../../common/result.js';
import { HEADER_SIZE, MAX_PAYLOAD, typeName } from './codec.js';

export interface Frame {
  type: number;
  flags: number;
  payload: Buffer;
}

/** A frame header the decoder refuses; after it the stream cannot be resynchronised. */
interface FrameError {
  message: string;
  /** Type field of the offending header (0 when unknown). */
  type: number;
}

export type DecodeResult = Result<Frame, FrameError>;

/** `push` gives the frames the bytes complete, up to the first header error (then dead); a type not in `allowedTypes` is one. */
export class FrameDecoder {
  private chunks: Buffer[] = [];
  private buffered = 0;
  private header: { type: number; flags: number; length: number } | null = null;
  private dead = false;

  constructor(private readonly allowedTypes: ReadonlySet<number>) {}

  /** Bytes of the incomplete frame received so far, header included; 0 exactly between frames. */
  get incompleteBytes(): number {
    return this.buffered + (this.header !== null ? HEADER_SIZE : 0);
  }

  /** Bytes to the end of the current frame (or header): reading no more, every frame starts a read (how the client pairs fds). */
  get bytesToFrameEnd(): number {
    return this.header === null ? HEADER_SIZE - this.buffered : this.header.length - this.buffered;
  }

  push(data: Buffer): DecodeResult[] {
    if (this.dead) return [];
    const out: DecodeResult[] = [];
    let buf = data;
    // A zero-length frame completes as soon as its header is in.
    while (buf.length > 0 || this.header?.length === 0) {
      const need = this.bytesToFrameEnd;
      if (buf.length < need) {
        // Copy: the caller's buffer may be reused.
        if (buf.length > 0) this.chunks.push(Buffer.from(buf));
        this.buffered += buf.length;
        return out;
      }
      const bytes = this.take(buf.subarray(0, need));
      buf = buf.subarray(need);
      const h = this.header;
      if (h !== null) {
        this.header = null;
        out.push(ok({ type: h.type, flags: h.flags, payload: bytes }));
        continue;
      }
      const type = bytes.readUInt16LE(0);
      const length = bytes.readUInt32LE(4);
      const problem = !this.allowedTypes.has(type)
        ? `unknown frame type ${typeName(type)}`
        : length > MAX_PAYLOAD
          ? `frame length ${length} is over the maximum of ${MAX_PAYLOAD}`
          : null;
      if (problem !== null) {
        this.dead = true;
        out.push(fail({ message: problem, type }));
        return out;
      }
      this.header = { type, flags: bytes.readUInt16LE(2), length };
    }
    return out;
  }

  private take(tail: Buffer): Buffer {
    if (this.buffered === 0) return Buffer.from(tail);
    const all = Buffer.concat([...this.chunks, tail]);
    this.chunks = [];
    this.buffered = 0;
    return all;
  }
}
