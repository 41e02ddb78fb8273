/**
 * A VM's statistics file (docs/stats-fd.md) mirrored into its guest directory: a regular file of the
 * same bytes, mapped by the helper, whose values are copied from the daemon's own file after each
 * sample under the same seqlock (SampleBlock.write: generation odd, values, generation even), so a
 * reader there reads it exactly as it reads the fd STATS_FD hands out. No system call per sample.
 * The tree's zones (tree.ts) read their values from the daemon's file too (energy, <domain>_energy):
 * the VM's output is not built a second time for them.
 */
import { decodeStatsLayout, type StatsLayout } from '../protocol/stats/layout.js';
import { SampleBlock } from '../protocol/stats/sample-block.js';
import type { SharedMapping } from '../os/libc.js';
import type { GuestTree } from './safe-dir.js';
import { guestZoneShapes } from './tree.js';
import { vmDomainNames } from '../protocol/stats/vm-file.js';
import { isOtherDomain } from '../model/domains.js';

/** A zone of the tree, read from the file: the words of the data block whose values it sums. */
interface MirroredZone {
  id: string;
  name: string;
  words: number[];
}

/** The daemon's file of a VM: its bytes (a mapping the daemon writes at each sample) and size. */
export interface StatsSource {
  readonly memory: ArrayBuffer;
  readonly size: number;
}

export class StatsMirror {
  private readonly block: SampleBlock;
  private readonly from: BigUint64Array;
  private readonly to: BigUint64Array;
  private readonly fromValues: BigUint64Array;
  /** The same data blocks as 32-bit halves: compared without making a BigInt per word. */
  private readonly fromHalves: Uint32Array;
  private readonly toHalves: Uint32Array;
  private readonly copyValues = () => this.to.set(this.fromValues, 1);
  private readonly endedWord: number;
  /** The VM's zones (tree.ts), read from the daemon's file: no output built again per sample. */
  readonly zones: readonly MirroredZone[];

  private constructor(
    private readonly source: StatsSource,
    private readonly mapping: SharedMapping,
    readonly ino: bigint,
    layout: StatsLayout,
  ) {
    this.block = new SampleBlock(mapping.memory, layout);
    this.from = new BigUint64Array(source.memory, layout.dataOffset, layout.dataSize / 8);
    this.to = new BigUint64Array(mapping.memory, layout.dataOffset, layout.dataSize / 8);
    this.fromValues = this.from.subarray(1);
    this.fromHalves = new Uint32Array(source.memory, layout.dataOffset, layout.dataSize / 4);
    this.toHalves = new Uint32Array(mapping.memory, layout.dataOffset, layout.dataSize / 4);
    const word = (name: string) => {
      const d = layout.descriptors.find((x) => x.name === name);
      if (d === undefined) throw new Error(`the statistics file has no ${name}`);
      return d.offset / 8;
    };
    this.endedWord = word('ended');
    const nvpkg = layout.descriptors.find((d) => d.name === 'energy')?.size ?? 0;
    const domains = layout.descriptors.map((d) => d.name.replace(/_energy$/, '')).filter((d) => isOtherDomain(d));
    this.zones = guestZoneShapes(nvpkg, domains).map((z) => {
      const at = word(isOtherDomain(z.domain) ? vmDomainNames(z.domain).energy : 'energy');
      return { id: z.id, name: z.name, words: z.vpkgs.map((g) => at + g) };
    });
  }

  /** The energy a zone counts now, µJ (the daemon's file, written this sample). */
  energyOf(z: MirroredZone): bigint {
    let sum = 0n;
    for (const w of z.words) sum += this.from[w]!;
    return sum;
  }

  /** Whether a zone's words in the daemon's file are what the last copy() took: its energy did not change since. */
  unchanged(z: MirroredZone): boolean {
    for (const w of z.words)
      if (this.fromHalves[2 * w] !== this.toHalves[2 * w] || this.fromHalves[2 * w + 1] !== this.toHalves[2 * w + 1]) return false;
    return true;
  }

  /** Whether the daemon's file says the VM ended. */
  get ended(): boolean {
    return this.from[this.endedWord] !== 0n;
  }

  /** The file `file` in `dir`, made from `source`'s bytes now (renamed over an older one). */
  static create(dir: GuestTree, file: string, source: StatsSource): StatsMirror {
    const bytes = Buffer.from(new Uint8Array(source.memory, 0, source.size));
    const layout = decodeStatsLayout(bytes, source.size);
    if (!layout.ok) throw new Error(`the statistics file does not decode: ${layout.error}`);
    const made = dir.mapped(file, bytes);
    return new StatsMirror(source, made.mapping, made.ino, layout.value);
  }

  /** Whether this mirrors `source` (the daemon makes a new file when a VM's vCPU list changes shape). */
  mirrors(source: StatsSource): boolean {
    return source === this.source;
  }

  /** The source's values now, every one but its generation, as one sample of this file. */
  copy(): void {
    this.block.write(this.copyValues);
  }

  /** Unmaps (the file stays, with its last values). Returns null, for `x = x.close()`. */
  close(): null {
    this.mapping.unmap();
    return null;
  }
}
