/**
 * A VM's statistics file (docs/stats-fd.md) in its guest directory: a regular file of the same bytes
 * as the fd STATS_FD hands out, mapped by the helper and written at each sample by the daemon's own
 * writer of the VM's statistics (its StatsCopy) under the same seqlock (generation odd, values,
 * generation even), so a reader there reads it exactly as it reads that fd. No system call and no
 * copy per sample. The tree's zones (tree.ts) read their values from this file (energy,
 * <domain>_energy): the VM's output is not built a second time for them.
 */
import type { StatsLayout } from '../protocol/stats/layout.js';
import type { SharedMapping } from '../os/libc/memfd-mmap.js';
import type { GuestTree } from './safe-dir.js';
import { guestZoneShapes } from './tree.js';
import { vmDomainNames } from '../protocol/stats/vm-file.js';
import { isOtherDomain } from '../model/domains.js';

/** A zone of the tree, read from the file: the words of the data block whose values it sums. */
interface FileZone {
  id: string;
  name: string;
  words: number[];
  /** Its words' halves when last read (energyOf): compared without making a BigInt per word. */
  seen: Uint32Array;
}

/** The daemon's writer of a VM's statistics into memory the guest directory mapped (StatsFiles.copy). */
export interface StatsCopy {
  readonly layout: StatsLayout;
  /** Written at each sample; false once the daemon writes it no more (the VM dropped, or its file replaced by one of a new shape). */
  readonly current: boolean;
  /** Samples written with the VM's values (the others moved its times and power alone): while it stays, no value moved. */
  readonly valuesWritten: number;
  /** Never written again. */
  close(): void;
}

/** Makes the daemon write a VM's statistics into the memory `map` returns, given the file's bytes now; null when it cannot. */
type OpenStatsCopy = (map: (bytes: Buffer) => ArrayBuffer) => StatsCopy | null;

export class GuestStatsFile {
  private readonly words: BigUint64Array;
  private readonly halves: Uint32Array;
  private readonly endedWord: number;
  /** copy.valuesWritten when valuesMoved() last looked. */
  private valuesSeen = -1;
  /** The VM's zones (tree.ts), read from this file. */
  readonly zones: readonly FileZone[];

  private constructor(
    private readonly copy: StatsCopy,
    private readonly mapping: SharedMapping,
    readonly ino: bigint,
  ) {
    const layout = copy.layout;
    this.words = new BigUint64Array(mapping.memory, layout.dataOffset, layout.dataSize / 8);
    this.halves = new Uint32Array(mapping.memory, layout.dataOffset, layout.dataSize / 4);
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
      return { id: z.id, name: z.name, words: z.vpkgs.map((g) => at + g), seen: new Uint32Array(2 * z.vpkgs.length) };
    });
  }

  /** The energy a zone counts now, µJ (written this sample), remembered as seen. */
  energyOf(z: FileZone): bigint {
    let sum = 0n;
    for (let i = 0; i < z.words.length; i++) {
      const w = z.words[i]!;
      z.seen[2 * i] = this.halves[2 * w]!;
      z.seen[2 * i + 1] = this.halves[2 * w + 1]!;
      sum += this.words[w]!;
    }
    return sum;
  }

  /** Whether a zone's words are what energyOf() last read: its energy did not change since. */
  unchanged(z: FileZone): boolean {
    for (let i = 0; i < z.words.length; i++) {
      const w = z.words[i]!;
      if (this.halves[2 * w] !== z.seen[2 * i] || this.halves[2 * w + 1] !== z.seen[2 * i + 1]) return false;
    }
    return true;
  }

  /** Whether the daemon wrote the VM's values (not only the times of an idle interval) since the last call. */
  valuesMoved(): boolean {
    const moved = this.copy.valuesWritten !== this.valuesSeen;
    this.valuesSeen = this.copy.valuesWritten;
    return moved;
  }

  /** Whether the file says the VM ended. */
  get ended(): boolean {
    return this.halves[2 * this.endedWord] !== 0 || this.halves[2 * this.endedWord + 1] !== 0;
  }

  /** Whether the daemon still writes it (false: a new file is to be made, of the VM's new shape). */
  get current(): boolean {
    return this.copy.current;
  }

  /** The file `file` in `dir`, made now of the VM's statistics (renamed over an older one) and written by the daemon from then on; null when `open` cannot. */
  static create(dir: GuestTree, file: string, open: OpenStatsCopy): GuestStatsFile | null {
    let made: { mapping: SharedMapping; ino: bigint } | null = null;
    const copy = open((bytes) => {
      made = dir.mapped(file, bytes);
      return made.mapping.memory;
    });
    if (copy === null || made === null) return null;
    const m: { mapping: SharedMapping; ino: bigint } = made;
    try {
      return new GuestStatsFile(copy, m.mapping, m.ino);
    } catch (e) {
      copy.close();
      m.mapping.unmap();
      throw e;
    }
  }

  /** Written no more and unmapped (the file stays, with its last values). Returns null, for `x = x.close()`. */
  close(): null {
    this.copy.close();
    this.mapping.unmap();
    return null;
  }
}
