/**
 * v2 framing (docs/protocol.md "v2"): `u16 type, u16 flags, u32 length, payload`, little-endian.
 * Pure: no sockets. The decoder takes bytes as they arrive (split anywhere, or pipelined) and never
 * buffers more than one frame, so a hostile peer cannot make it grow past MAX_PAYLOAD + header.
 */

// "VMS2" is defined once, beside the preamble check that picks the protocol for a connection.
export { V2_MAGIC } from '../legacy.js';
import type { VcpuSpec } from '../../ratio/types.js';
import { fail, ok, type Result } from '../../ratio/result.js';

export const HEADER_SIZE = 8;
export const MAX_PAYLOAD = 65536;

export const T = {
  REGISTER: 0x01,
  READ: 0x02,
  SUBSCRIBE: 0x03,
  UNREGISTER: 0x04,
  REGISTERED: 0x81,
  VALUE: 0x82,
  UPDATE: 0x83,
  OK: 0x84,
  ERROR: 0xff,
} as const;

export const CLIENT_TYPES: ReadonlySet<number> = new Set([T.REGISTER, T.READ, T.SUBSCRIBE, T.UNREGISTER]);
export const HELPER_TYPES: ReadonlySet<number> = new Set([T.REGISTERED, T.VALUE, T.UPDATE, T.OK, T.ERROR]);

export const E = {
  MALFORMED: 1,
  NOT_PERMITTED: 2,
  NO_SUCH: 3,
  LIMIT: 4,
  ENERGY_SOURCE: 5,
  PROCESS_GONE: 6,
} as const;

export type ErrorCode = (typeof E)[keyof typeof E];

/** Bit 0 of flags on VALUE and UPDATE: the VM has ended, values are final. */
export const FLAG_ENDED = 0x1;

/** Error codes in words, for logs and the CLI. */
export function errorCodeName(code: number): string {
  switch (code) {
    case E.MALFORMED:
      return 'malformed request';
    case E.NOT_PERMITTED:
      return 'not permitted';
    case E.NO_SUCH:
      return 'no such VM or virtual package';
    case E.LIMIT:
      return 'limit reached';
    case E.ENERGY_SOURCE:
      return 'energy source failed';
    case E.PROCESS_GONE:
      return 'process gone';
    default:
      return `unknown error code ${code}`;
  }
}

export function typeName(type: number): string {
  const entry = Object.entries(T).find(([, v]) => v === type);
  return entry ? entry[0] : `0x${type.toString(16).padStart(2, '0')}`;
}

export interface Frame {
  type: number;
  flags: number;
  payload: Buffer;
}

/** A frame header the decoder refuses; after it the stream cannot be resynchronised. */
export interface FrameError {
  message: string;
  /** Type field of the offending header (0 when unknown). */
  type: number;
}

export type DecodeResult = Result<Frame, FrameError>;

/**
 * Incremental decoder. `push` returns every frame completed by the new bytes; it stops at (and
 * returns) the first header error, after which the decoder is dead: the protocol closes the connection (docs/protocol.md).
 * `allowedTypes` rejects unknown types as soon as the header is in, before waiting for its payload.
 */
export class FrameDecoder {
  private chunks: Buffer[] = [];
  private buffered = 0;
  private header: { type: number; flags: number; length: number } | null = null;
  private dead = false;

  constructor(private readonly allowedTypes: ReadonlySet<number>) {}

  /** Bytes held, waiting for the rest of a frame (at most HEADER_SIZE + MAX_PAYLOAD). */
  get pending(): number {
    return this.buffered;
  }

  get failed(): boolean {
    return this.dead;
  }

  push(data: Buffer): DecodeResult[] {
    if (this.dead) return [];
    const out: DecodeResult[] = [];
    let buf = data;
    while (buf.length > 0 || this.ready()) {
      if (this.header === null) {
        const need = HEADER_SIZE - this.buffered;
        if (buf.length < need) {
          this.keep(buf);
          return out;
        }
        const head = this.take(buf.subarray(0, need));
        buf = buf.subarray(need);
        const type = head.readUInt16LE(0);
        const flags = head.readUInt16LE(2);
        const length = head.readUInt32LE(4);
        if (!this.allowedTypes.has(type)) {
          this.dead = true;
          out.push(fail({ message: `unknown frame type ${typeName(type)}`, type }));
          return out;
        }
        if (length > MAX_PAYLOAD) {
          this.dead = true;
          out.push(fail({ message: `frame length ${length} is over the maximum of ${MAX_PAYLOAD}`, type }));
          return out;
        }
        this.header = { type, flags, length };
      }
      const h = this.header;
      const need = h.length - this.buffered;
      if (buf.length < need) {
        this.keep(buf);
        return out;
      }
      const payload = this.take(buf.subarray(0, need));
      buf = buf.subarray(need);
      this.header = null;
      out.push(ok({ type: h.type, flags: h.flags, payload }));
    }
    return out;
  }

  // A zero-length frame completes as soon as its header is in.
  private ready(): boolean {
    return this.header !== null && this.header.length === 0;
  }

  private keep(buf: Buffer): void {
    if (buf.length === 0) return;
    // Copy: the caller's buffer may be reused (net sockets hand out fresh ones, but be safe).
    this.chunks.push(Buffer.from(buf));
    this.buffered += buf.length;
  }

  /** Joins what is kept with `tail` into one buffer and empties the store. */
  private take(tail: Buffer): Buffer {
    if (this.buffered === 0) return Buffer.from(tail);
    const all = Buffer.concat([...this.chunks, tail]);
    this.chunks = [];
    this.buffered = 0;
    return all;
  }
}

export function encodeFrame(type: number, flags: number, payload: Buffer): Buffer {
  if (payload.length > MAX_PAYLOAD) throw new RangeError(`payload of ${payload.length} bytes is over ${MAX_PAYLOAD}`);
  const out = Buffer.alloc(HEADER_SIZE + payload.length);
  out.writeUInt16LE(type, 0);
  out.writeUInt16LE(flags, 2);
  out.writeUInt32LE(payload.length, 4);
  payload.copy(out, HEADER_SIZE);
  return out;
}

const U64_MAX = (1n << 64n) - 1n;

function u64(v: bigint): bigint {
  // Values are non-negative by construction; clamp instead of throwing inside a send path.
  return v < 0n ? 0n : v > U64_MAX ? U64_MAX : v;
}

// ---- helper -> client ----

export function encodeRegistered(vmId: number, nvpkg: number, powerUnit: bigint): Buffer {
  const p = Buffer.alloc(16);
  p.writeUInt32LE(vmId, 0);
  p.writeUInt32LE(nvpkg, 4);
  p.writeBigUInt64LE(u64(powerUnit), 8);
  return encodeFrame(T.REGISTERED, 0, p);
}

export interface VpkgValue {
  counter: bigint;
  energyUj: bigint;
}

export function encodeValue(vmId: number, vpkg: number, v: VpkgValue, tNs: bigint, ended: boolean): Buffer {
  const p = Buffer.alloc(32);
  p.writeUInt32LE(vmId, 0);
  p.writeUInt32LE(vpkg, 4);
  p.writeBigUInt64LE(u64(v.counter), 8);
  p.writeBigUInt64LE(u64(v.energyUj), 16);
  p.writeBigUInt64LE(u64(tNs), 24);
  return encodeFrame(T.VALUE, ended ? FLAG_ENDED : 0, p);
}

export function encodeUpdate(vmId: number, tNs: bigint, values: readonly VpkgValue[], ended: boolean): Buffer {
  const p = Buffer.alloc(16 + 16 * values.length);
  p.writeUInt32LE(vmId, 0);
  p.writeUInt32LE(values.length, 4);
  p.writeBigUInt64LE(u64(tNs), 8);
  values.forEach((v, i) => {
    p.writeBigUInt64LE(u64(v.counter), 16 + 16 * i);
    p.writeBigUInt64LE(u64(v.energyUj), 24 + 16 * i);
  });
  return encodeFrame(T.UPDATE, ended ? FLAG_ENDED : 0, p);
}

export function encodeOk(vmId: number): Buffer {
  const p = Buffer.alloc(4);
  p.writeUInt32LE(vmId, 0);
  return encodeFrame(T.OK, 0, p);
}

/** Messages are cut (at a character boundary) so the frame stays within MAX_PAYLOAD. */
export function encodeError(code: number, requestType: number, message: string): Buffer {
  let text = Buffer.from(message, 'utf8');
  if (text.length > MAX_PAYLOAD - 8) {
    text = Buffer.from(text.subarray(0, MAX_PAYLOAD - 8).toString('utf8').replace(/\uFFFD+$/, ''), 'utf8').subarray(0, MAX_PAYLOAD - 8);
  }
  const p = Buffer.alloc(8 + text.length);
  p.writeUInt32LE(code, 0);
  p.writeUInt32LE(requestType, 4);
  text.copy(p, 8);
  return encodeFrame(T.ERROR, 0, p);
}

// ---- client -> helper ----

export interface RegisterRequest {
  pid: number;
  vcpus: readonly VcpuSpec[];
}

export function encodeRegister(r: RegisterRequest): Buffer {
  const p = Buffer.alloc(8 + 8 * r.vcpus.length);
  p.writeUInt32LE(r.pid, 0);
  p.writeUInt32LE(r.vcpus.length, 4);
  r.vcpus.forEach((v, i) => {
    p.writeUInt32LE(v.tid, 8 + 8 * i);
    p.writeUInt32LE(v.vpkg, 12 + 8 * i);
  });
  return encodeFrame(T.REGISTER, 0, p);
}

export function encodeRead(vmId: number, vpkg: number): Buffer {
  const p = Buffer.alloc(8);
  p.writeUInt32LE(vmId, 0);
  p.writeUInt32LE(vpkg, 4);
  return encodeFrame(T.READ, 0, p);
}

export function encodeSubscribe(vmId: number): Buffer {
  const p = Buffer.alloc(4);
  p.writeUInt32LE(vmId, 0);
  return encodeFrame(T.SUBSCRIBE, 0, p);
}

export function encodeUnregister(vmId: number): Buffer {
  const p = Buffer.alloc(4);
  p.writeUInt32LE(vmId, 0);
  return encodeFrame(T.UNREGISTER, 0, p);
}
