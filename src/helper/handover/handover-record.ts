/**
 * The handover record, pure: what a restart hands over besides the state snapshot (state/snapshot-codec.ts), in its
 * own sealed memfd (state/memfd.ts). For each connection handed over: the inode of its socket (how the
 * next process pairs the record with the fd it got, whatever its number or order), what was read of
 * it and not answered yet (part of a legacy request, or fewer than 4 bytes of a connection whose
 * protocol is not known yet), and the legacy request counters. All little-endian:
 *
 *   header  magic "VMSRHAND" (8) | u32 format version | u32 payload length | u32 CRC-32 of the payload | u32 0
 *   payload u64 written at (CLOCK_MONOTONIC ns) | u64 legacy ok | u64 refused | u64 failed
 *           u32 connection count, each: u64 socket inode | u8 kind (1 legacy, 2 undecided) | u32 byte count | bytes
 *
 * The decoder reads it as hostile input: every count is bounded and checked against the bytes left,
 * an inode listed twice, an unknown kind or more than MAX_PENDING_BYTES refuse the whole record.
 */
import zlib from 'node:zlib';
import { cannot } from '../../common/errors.js';
import { fail, ok, type Result } from '../../common/result.js';

const HANDOVER_MAGIC: Buffer = Buffer.from('VMSRHAND', 'latin1');
const HANDOVER_FORMAT_VERSION = 1;
const HEADER = 24;
/** Connections one record may list (the daemon's --max-connections bound). */
const MAX_HANDED_CONNECTIONS = 1 << 20;
/**
 * Bytes read and not answered, per connection: the start of a request, and what the stream had read
 * ahead before reading stopped (Node's stream reads ahead up to 64 KiB).
 */
const MAX_PENDING_BYTES = 256 * 1024;
const KIND = { legacy: 1, undecided: 2 } as const;
const ENTRY_MIN = 13;
/** The largest record, header included. */
export const MAX_HANDOVER_BYTES = 64 * 1024 * 1024;
const FIX = 'the connections are served from their next byte on; the restart was made by another vmsr-helper or the record was damaged';

export interface HandedConnection {
  /** st_ino of the connection's socket: pairs the record with the fd handed over. */
  ino: bigint;
  /** 'legacy': a QEMU connection; 'undecided': its protocol is not known yet (fewer than 4 bytes read when reading stopped). */
  kind: keyof typeof KIND;
  pending: Buffer;
}

export interface HandoverRecord {
  writtenNs: bigint;
  legacy: { ok: number; refused: number; failed: number };
  connections: HandedConnection[];
}

const MAX_COUNTER = Number.MAX_SAFE_INTEGER;

/** Why a record cannot be written or used, or null. */
function handoverProblem(r: HandoverRecord): string | null {
  for (const [k, v] of Object.entries(r.legacy))
    if (!Number.isSafeInteger(v) || v < 0 || v > MAX_COUNTER) return `the legacy ${k} counter ${v} is out of range`;
  if (r.connections.length > MAX_HANDED_CONNECTIONS) return `${r.connections.length} connections, at most ${MAX_HANDED_CONNECTIONS}`;
  const seen = new Set<bigint>();
  for (const c of r.connections) {
    if (c.ino <= 0n || c.ino >= 1n << 64n) return `socket inode ${c.ino} is out of range`;
    if (seen.has(c.ino)) return `socket inode ${c.ino} is listed twice`;
    seen.add(c.ino);
    if (!(c.kind in KIND)) return `connection ${c.ino} has an unknown kind`;
    if (c.pending.length > MAX_PENDING_BYTES)
      return `connection ${c.ino} holds ${c.pending.length} pending bytes, at most ${MAX_PENDING_BYTES}`;
  }
  return null;
}

export function encodeHandover(r: HandoverRecord): Buffer {
  const problem = handoverProblem(r);
  if (problem !== null) throw new Error(cannot('write the handover record', problem));
  const size = 32 + 4 + r.connections.reduce((n, c) => n + ENTRY_MIN + c.pending.length, 0);
  if (HEADER + size > MAX_HANDOVER_BYTES)
    throw new Error(cannot('write the handover record', `it would be ${HEADER + size} bytes, at most ${MAX_HANDOVER_BYTES}`));
  const p = Buffer.alloc(size);
  let o = 0;
  p.writeBigUInt64LE(r.writtenNs, o);
  p.writeBigUInt64LE(BigInt(r.legacy.ok), (o += 8));
  p.writeBigUInt64LE(BigInt(r.legacy.refused), (o += 8));
  p.writeBigUInt64LE(BigInt(r.legacy.failed), (o += 8));
  p.writeUInt32LE(r.connections.length, (o += 8));
  o += 4;
  for (const c of r.connections) {
    p.writeBigUInt64LE(c.ino, o);
    p.writeUInt8(KIND[c.kind], o + 8);
    p.writeUInt32LE(c.pending.length, o + 9);
    c.pending.copy(p, o + ENTRY_MIN);
    o += ENTRY_MIN + c.pending.length;
  }
  const h = Buffer.alloc(HEADER);
  HANDOVER_MAGIC.copy(h, 0);
  h.writeUInt32LE(HANDOVER_FORMAT_VERSION, 8);
  h.writeUInt32LE(p.length, 12);
  h.writeUInt32LE(zlib.crc32(p), 16);
  return Buffer.concat([h, p]);
}

/** The record in `b`, or "cannot use the handover record: why; fix". `nowNs` refuses a record from the future (another boot). */
export function decodeHandover(b: Buffer, nowNs: bigint): Result<HandoverRecord> {
  const no = (why: string): Result<HandoverRecord> => fail(cannot('use the handover record', why, FIX));
  if (b.length < HEADER) return no(`it is ${b.length} bytes, shorter than its ${HEADER}-byte header`);
  if (!b.subarray(0, 8).equals(HANDOVER_MAGIC)) return no('it does not start with VMSRHAND');
  const version = b.readUInt32LE(8);
  if (version !== HANDOVER_FORMAT_VERSION) return no(`its format version is ${version}, this helper reads ${HANDOVER_FORMAT_VERSION}`);
  const len = b.readUInt32LE(12);
  if (len !== b.length - HEADER) return no(`its header says ${len} payload bytes, it holds ${b.length - HEADER}`);
  const p = b.subarray(HEADER);
  if (zlib.crc32(p) !== b.readUInt32LE(16) || b.readUInt32LE(20) !== 0) return no('its checksum does not match');
  if (p.length < 36) return no('it is cut off');
  const writtenNs = p.readBigUInt64LE(0);
  if (writtenNs > nowNs) return no('it was written after now on the monotonic clock (another boot)');
  const counter = (o: number) => {
    const v = p.readBigUInt64LE(o);
    return v > BigInt(MAX_COUNTER) ? -1 : Number(v);
  };
  const legacy = { ok: counter(8), refused: counter(16), failed: counter(24) };
  const count = p.readUInt32LE(32);
  if (count > MAX_HANDED_CONNECTIONS || count * ENTRY_MIN > p.length - 36)
    return no(`it lists ${count} connections, more than its bytes hold`);
  const connections: HandedConnection[] = [];
  let o = 36;
  for (let i = 0; i < count; i++) {
    if (o + ENTRY_MIN > p.length) return no('it is cut off');
    const kindByte = p.readUInt8(o + 8);
    const kind = kindByte === KIND.legacy ? 'legacy' : kindByte === KIND.undecided ? 'undecided' : null;
    if (kind === null) return no(`connection ${i} has the unknown kind ${kindByte}`);
    const n = p.readUInt32LE(o + 9);
    if (o + ENTRY_MIN + n > p.length) return no('it is cut off');
    connections.push({ ino: p.readBigUInt64LE(o), kind, pending: Buffer.from(p.subarray(o + ENTRY_MIN, o + ENTRY_MIN + n)) });
    o += ENTRY_MIN + n;
  }
  if (o !== p.length) return no(`${p.length - o} bytes follow its last connection`);
  const r: HandoverRecord = { writtenNs, legacy, connections };
  const problem = handoverProblem(r);
  return problem === null ? ok(r) : no(problem);
}
