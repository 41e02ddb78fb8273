/** Little-endian bytes for the state codec: a writer that refuses a value out of range or a list past its bound, a reader these and anything cut off. */
/** The header before the payload (magic, version, length, CRC, 0): offsets in errors count it. */
export const STATE_HEADER_SIZE = 24;
const MAX_U64 = (1n << 64n) - 1n;

/** A test that holds for each key the first time only: what finds an id twice. */
export function firstTime(): (key: unknown) => boolean {
  const seen = new Set<unknown>();
  return (key) => seen.size < seen.add(key).size;
}

/** A layout said once for both ways: a Writer writes each value given and returns it, a Reader, given undefined, returns what it read. */
export type Io = Pick<Writer, 'u8' | 'u16' | 'u32' | 'u64' | 'f64' | 'safe' | 'bytes' | 'list'>;

/** Through a DataView: fast from the first call, where Buffer's setters run interpreted until warm (docs/daemon.md "Where the time goes"). */
export class Writer implements Io {
  private buf = Buffer.alloc(4096);
  private view = new DataView(this.buf.buffer, this.buf.byteOffset, this.buf.byteLength);

  /** `length` zero bytes in: room for a header written last. */
  constructor(public length = 0) {}

  private room(n: number): number {
    if (this.length + n > this.buf.length) {
      const bigger = Buffer.alloc(Math.max(this.buf.length * 2, this.length + n));
      this.buf.copy(bigger, 0, 0, this.length);
      this.buf = bigger;
      this.view = new DataView(bigger.buffer, bigger.byteOffset, bigger.byteLength);
    }
    const at = this.length;
    this.length += n;
    return at;
  }

  /** A whole number in 0..max, or a RangeError: a DataView would wrap it. */
  private uint(n: 1 | 2 | 4, v: number | undefined, max: number, what: string): number {
    if (!Number.isInteger(v) || v! < 0 || v! > max) throw new RangeError(`${what}: ${v} is out of range (0..${max})`);
    // room() first: it may replace this.view (`this.view.setX(this.room(n), v)` would write the old one).
    const at = this.room(n);
    if (n === 1) this.view.setUint8(at, v!);
    else if (n === 2) this.view.setUint16(at, v!, true);
    else this.view.setUint32(at, v!, true);
    return v!;
  }
  u8 = (v: number | undefined, what: string): number => this.uint(1, v, 0xff, what);
  u16 = (v: number | undefined, what: string): number => this.uint(2, v, 0xffff, what);
  u32 = (v: number | undefined, what: string): number => this.uint(4, v, 0xffffffff, what);
  u64(v: bigint | undefined, what: string): bigint {
    if (typeof v !== 'bigint' || v < 0n || v > MAX_U64) throw new RangeError(`${what}: ${v} is out of range (0..2^64-1)`);
    const at = this.room(8);
    this.view.setBigUint64(at, v, true);
    return v;
  }
  /** A u64 that must be a safe integer (a starttime). */
  safe(v: number | undefined, what: string): number {
    if (!Number.isSafeInteger(v) || v! < 0) throw new RangeError(`${what}: ${v} is out of range (0..2^53-1)`);
    this.u64(BigInt(v!), what);
    return v!;
  }
  f64(v: number | undefined, _what: string): number {
    const at = this.room(8);
    this.view.setFloat64(at, v!, true);
    return v!;
  }
  /** `n` bytes: the reader's length, read before. */
  bytes(b: Buffer | undefined, _n: number, _what: string): Buffer {
    const at = this.room(b!.length);
    b!.copy(this.buf, at);
    return b!;
  }
  /** A count (u16 or u32; at most `max`, its entries of `entrySize` bytes at least fit the bytes left), then each entry. */
  list<T>(width: 2 | 4, items: readonly T[] | undefined, max: number, entrySize: number, what: string, entry: (t?: T) => T): T[] {
    if (items!.length > max) throw new RangeError(`it has ${items!.length} ${what}, at most ${max}`);
    this.uint(width, items!.length, width === 2 ? 0xffff : 0xffffffff, `the count of ${what}`);
    for (const it of items!) entry(it);
    return items as T[];
  }
  done(): Buffer {
    return this.buf.subarray(0, this.length);
  }
}

/** Thrown by a layout's check while reading or writing, turned into the decoder's failure or the encoder's RangeError. */
export class Refused extends Error {}

export class Reader implements Io {
  off = 0;
  constructor(private readonly buf: Buffer) {}

  private at(n: number, what: string): number {
    if (this.off + n > this.buf.length)
      throw new Refused(`it is cut off in ${what} (byte ${STATE_HEADER_SIZE + this.off} of ${STATE_HEADER_SIZE + this.buf.length})`);
    const o = this.off;
    this.off += n;
    return o;
  }
  u8 = (_: unknown, what: string): number => this.buf.readUInt8(this.at(1, what));
  u16 = (_: unknown, what: string): number => this.buf.readUInt16LE(this.at(2, what));
  u32 = (_: unknown, what: string): number => this.buf.readUInt32LE(this.at(4, what));
  u64 = (_: unknown, what: string): bigint => this.buf.readBigUInt64LE(this.at(8, what));
  f64 = (_: unknown, what: string): number => this.buf.readDoubleLE(this.at(8, what));
  safe(_: unknown, what: string): number {
    const v = this.u64(_, what);
    if (v > BigInt(Number.MAX_SAFE_INTEGER)) throw new Refused(`${what} ${v} is out of range`);
    return Number(v);
  }
  bytes(_: unknown, n: number, what: string): Buffer {
    const o = this.at(n, what);
    return Buffer.from(this.buf.subarray(o, o + n));
  }
  list<T>(width: 2 | 4, _: unknown, max: number, entrySize: number, what: string, entry: () => T): T[] {
    const n = width === 2 ? this.u16(_, `the count of ${what}`) : this.u32(_, `the count of ${what}`);
    if (n > max) throw new Refused(`it has ${n} ${what}, at most ${max}`);
    if (n * entrySize > this.left) throw new Refused(`it is cut off in the ${n} ${what} it announces`);
    const out: T[] = [];
    for (let i = 0; i < n; i++) out.push(entry());
    return out;
  }
  get left(): number {
    return this.buf.length - this.off;
  }
}
