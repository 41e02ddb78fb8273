/** A statistics file's data block as the writer sees it, and the rule writer and readers share (docs/stats-fd.md "Consistent samples"). */
import type { StatsLayout } from './layout.js';

/** Name of the generation counter; the first descriptor of every file the helper makes. */
export const GENERATION = 'generation';
const TWO_32 = 4294967296;

export class SampleBlock {
  private readonly words: BigUint64Array;
  private readonly halves: Uint32Array;
  private readonly index = new Map<string, { at: number; size: number }>();
  private generation = 0n;

  constructor(memory: ArrayBuffer, layout: StatsLayout) {
    if (layout.descriptors[0]?.name !== GENERATION || layout.descriptors[0].offset !== 0)
      throw new RangeError('stats: the first descriptor must be the generation, at offset 0');
    if (memory.byteLength < layout.fileSize)
      throw new RangeError(`stats: ${memory.byteLength} bytes of memory for a file of ${layout.fileSize}`);
    this.words = new BigUint64Array(memory, layout.dataOffset, layout.dataSize / 8);
    this.halves = new Uint32Array(memory, layout.dataOffset, layout.dataSize / 4);
    for (const d of layout.descriptors) this.index.set(d.name, { at: d.offset / 8, size: d.size });
    this.generation = this.words[0]!;
  }

  /** Word index of `name`'s first value; throws for a name the file does not have. */
  slot(name: string): number {
    const s = this.index.get(name);
    if (s === undefined) throw new RangeError(`stats: no descriptor ${name}`);
    return s.at;
  }

  has(name: string): boolean {
    return this.index.has(name);
  }

  /** One sample: generation odd, `fill`, generation even; Atomics stores (sequentially consistent: no value store crosses them). */
  write(fill: (b: SampleBlock) => void): void {
    Atomics.store(this.words, 0, ++this.generation);
    try {
      fill(this);
    } finally {
      Atomics.store(this.words, 0, ++this.generation);
    }
  }

  /** A value below 2^53 (a JS number): floored, negatives and NaN as 0. */
  setNumber(at: number, v: number): void {
    const n = v > 0 ? Math.floor(v) : 0;
    this.halves[2 * at] = n % TWO_32;
    this.halves[2 * at + 1] = Math.floor(n / TWO_32);
  }

  setBig(at: number, v: bigint): void {
    this.words[at] = v < 0n ? 0n : v;
  }

  get(at: number): bigint {
    return this.words[at]!;
  }
}

interface RetryOptions {
  tries?: number;
  /** A generation read after all this reader read before: it will do as the "before", so a poller reads it once per read. */
  known?: bigint;
  /** Called before retry `attempt` (1, 2, ...): the writer may be preempted mid-sample, so back off rather than spin. */
  pause?: (attempt: number) => void;
}

/** The values once the same even generation was seen before and after them; null after `tries` (never a torn sample). */
export function readConsistent<T>(
  readGeneration: () => bigint,
  readValues: () => T,
  o: RetryOptions = {},
): { generation: bigint; values: T } | null {
  const tries = o.tries ?? 100;
  let g1 = o.known ?? readGeneration();
  for (let i = 0; i < tries; i++) {
    if (i > 0) o.pause?.(i);
    if ((g1 & 1n) !== 0n) {
      g1 = readGeneration();
      continue;
    }
    const values = readValues();
    const g2 = readGeneration();
    if (g2 === g1) return { generation: g1, values };
    g1 = g2;
  }
  return null;
}
