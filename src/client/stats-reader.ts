/** A statistics file's reader, owning its fd: layout checked once, file mapped read-only, read() the generation rule (docs/stats-fd.md). */
import fs from 'node:fs';
import { cannotError } from '../common/errors.js';
import { closeFd, pread } from '../os/libc/fds.js';
import { mapShared, type SharedMapping } from '../os/libc/memfd-mmap.js';
import { decodeStatsLayout, MAX_STATS_FILE_BYTES, type PlacedDescriptor, type StatsLayout } from '../protocol/stats/layout.js';
import { GENERATION, readConsistent } from '../protocol/stats/sample-block.js';
import { descriptorValues } from '../protocol/stats/values.js';
import { statsScale } from '../protocol/stats/flags.js';

/** A read retries while the helper writes: SPIN tries at once, then one a BACKOFF (a helper preempted mid-sample), about 1 s in all. */
const STATS_READ_TRIES = 1000;
const STATS_SPIN_TRIES = 10;
const STATS_BACKOFF_MS = 1;
const pauseCell = new Int32Array(new SharedArrayBuffer(4));
/** Sleeps `ms` without returning to the event loop (read() is synchronous). */
const pause = (attempt: number) => {
  if (attempt > STATS_SPIN_TRIES) Atomics.wait(pauseCell, 0, 0, STATS_BACKOFF_MS);
};

/** One consistent sample: its generation and the data block's bytes (decode with value()/values()). */
export interface StatsSample {
  generation: bigint;
  data: Buffer;
}

export class StatsReader {
  private readonly genBuf = Buffer.alloc(8);
  private readonly dataBuf: Buffer;
  private readonly byName = new Map<string, PlacedDescriptor>();
  private readonly genAt: number;
  private fdOpen: number | null;
  /** The file mapped read-only, shared: null when it could not be (then read() preads). */
  private mapped: { mapping: SharedMapping; generation: () => bigint; copy: () => Buffer } | null = null;
  /** The generation the last read ended with: the "before" of the next read. */
  private lastGeneration: bigint | undefined;

  private constructor(
    fd: number,
    readonly layout: StatsLayout,
  ) {
    this.fdOpen = fd;
    this.dataBuf = Buffer.alloc(layout.dataSize);
    for (const d of layout.descriptors) this.byName.set(d.name, d);
    const g = this.byName.get(GENERATION);
    if (!g) throw cannotError('read the statistics file', 'it has no generation descriptor', 'ask the helper for a new fd');
    this.genAt = layout.dataOffset + g.offset;
    try {
      const mapping = mapShared(fd, layout.fileSize, false);
      const gen = new BigUint64Array(mapping.memory, this.genAt, 1);
      const data = new Uint8Array(mapping.memory, layout.dataOffset, layout.dataSize);
      const out = this.dataBuf;
      this.mapped = { mapping, generation: () => Atomics.load(gen, 0), copy: () => (out.set(data), out) };
    } catch {
      this.mapped = null;
    }
  }

  /** A reader of `fd` (taken over: closed on failure too). Throws "cannot read the statistics file: why". */
  static open(fd: number): StatsReader {
    try {
      const size = fs.fstatSync(fd).size;
      if (size > MAX_STATS_FILE_BYTES) throw new Error(`it is ${size} bytes, over ${MAX_STATS_FILE_BYTES}`);
      const head = Buffer.alloc(size);
      const n = pread(fd, head, size, 0);
      if (n < 0) throw new Error(`pread: errno ${-n}`);
      const layout = decodeStatsLayout(head.subarray(0, n), size);
      if (!layout.ok) throw new Error(layout.error);
      return new StatsReader(fd, layout.value);
    } catch (e) {
      closeFd(fd);
      throw cannotError('read the statistics file', (e as Error).message, 'ask the helper for a new fd (STATS_FD)');
    }
  }

  descriptor(name: string): PlacedDescriptor | undefined {
    return this.byName.get(name);
  }

  /** The factor `name`'s raw values are multiplied by to get its unit (its base and exponent); 1 when absent. */
  scale(name: string): number {
    const d = this.byName.get(name);
    return d ? statsScale(d.flags, d.exponent) : 1;
  }

  /** One whole sample, from the mapping; its data buffer is reused by the next read: decode it first. */
  read(): StatsSample {
    if (this.mapped === null) return this.readByPread();
    return this.consistent(this.mapped.generation, this.mapped.copy);
  }

  /** The same as read(), with pread(2) only: two preads, three after a write. */
  readByPread(): StatsSample {
    return this.consistent(this.preadGeneration, this.preadValues);
  }

  private consistent(readGeneration: () => bigint, readValues: () => Buffer): StatsSample {
    const got = readConsistent(readGeneration, readValues, {
      tries: STATS_READ_TRIES,
      pause,
      ...(this.lastGeneration !== undefined ? { known: this.lastGeneration } : {}),
    });
    if (!got) {
      const s = ((STATS_READ_TRIES - STATS_SPIN_TRIES) * STATS_BACKOFF_MS) / 1000;
      throw cannotError(
        'read the statistics file',
        `the helper was writing during ${STATS_READ_TRIES} tries over about ${s} s`,
        'read again later',
      );
    }
    this.lastGeneration = got.generation;
    return { generation: got.generation, data: got.values };
  }

  private readonly preadGeneration = (): bigint => {
    if (pread(this.fd, this.genBuf, 8, this.genAt) !== 8)
      throw cannotError('read the statistics file', 'its generation could not be read', 'ask for a new fd');
    return this.genBuf.readBigUInt64LE(0);
  };

  private readonly preadValues = (): Buffer => {
    const n = pread(this.fd, this.dataBuf, this.dataBuf.length, this.layout.dataOffset);
    if (n !== this.dataBuf.length)
      throw cannotError('read the statistics file', `its data block gave ${n} of ${this.dataBuf.length} bytes`, 'ask for a new fd');
    return this.dataBuf;
  };

  /** `name`'s values in `s` (undefined when the file has no such descriptor: the helper cannot give it). */
  values(s: StatsSample, name: string): bigint[] | undefined {
    const d = this.byName.get(name);
    return d ? descriptorValues(d, s.data) : undefined;
  }

  value(s: StatsSample, name: string): bigint | undefined {
    const d = this.byName.get(name);
    return d ? s.data.readBigUInt64LE(d.offset) : undefined;
  }

  get fd(): number {
    if (this.fdOpen === null) throw new Error('the statistics reader is closed');
    return this.fdOpen;
  }

  close(): void {
    // The views over the mapping go with it: nothing reads them after this.
    this.mapped?.mapping.unmap();
    this.mapped = null;
    if (this.fdOpen !== null) closeFd(this.fdOpen);
    this.fdOpen = null;
  }
}
