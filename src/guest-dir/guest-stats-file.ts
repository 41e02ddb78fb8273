/** A VM's statistics file in its guest directory: STATS_FD's bytes (docs/stats-fd.md), mapped and written each sample by the daemon. */
import type { SharedMapping } from '../os/libc/memfd-mmap.js';
import type { VmStatsShape } from '../protocol/stats/vm-file.js';
import type { VmTotals } from '../ratio/outputs.js';
import type { SafeDir } from './safe-dir.js';
import { guestZoneShapes, type ZoneShape } from './tree.js';

/** A zone of the tree with its counts when last read (energyOf): compared without making a BigInt. */
type FileZone = ZoneShape & { seen: number[] };

/** The daemon's writer of a VM's statistics into memory the guest directory mapped (StatsFiles.copy). */
export interface StatsCopy {
  readonly shape: Pick<VmStatsShape, 'nvpkg' | 'domains'>;
  /** The VM's totals the file is written from, refilled in place at each sample. */
  readonly totals: VmTotals;
  /** Written at each sample; false once the daemon writes it no more (the VM dropped, or its file replaced by one of a new shape). */
  readonly current: boolean;
  /** Samples written with the VM's values (the others moved its times and power alone): while it stays, no value moved. */
  readonly valuesWritten: number;
  close(): void;
}

/** Makes the daemon write a VM's statistics into the memory `map` returns, given the file's bytes now; null when it cannot. */
type OpenStatsCopy = (map: (bytes: Buffer) => ArrayBuffer) => StatsCopy | null;

/** A count as the file holds it (SampleBlock.setNumber: floored, at least 0). */
const held = (v: number) => BigInt(v > 0 ? Math.floor(v) : 0);

export class GuestStatsFile {
  private valuesSeen = -1;
  readonly zones: readonly FileZone[];

  private constructor(
    readonly copy: StatsCopy,
    private readonly mapping: SharedMapping,
    readonly ino: bigint,
  ) {
    this.zones = guestZoneShapes(copy.shape.nvpkg, copy.shape.domains).map((z) => ({ ...z, seen: z.vpkgs.map(() => 0) }));
  }

  /** The counts a zone sums now; undefined when the totals lack its domain (the file keeps its last). */
  private counts(z: FileZone): readonly number[] | undefined {
    const t = this.copy.totals;
    return z.domain === 'package' ? t.energyUj : t.domains.find((d) => d.domain === z.domain)?.energyUj;
  }

  /** The energy a zone counts now, µJ (as the file holds it this sample), remembered as seen. */
  energyOf(z: FileZone): bigint {
    const c = this.counts(z);
    let sum = 0n;
    for (let i = 0; i < z.vpkgs.length; i++) {
      z.seen[i] = c?.[z.vpkgs[i]!] ?? z.seen[i]!;
      sum += held(z.seen[i]!);
    }
    return sum;
  }

  /** Whether a zone's counts are what energyOf() last read: its energy did not change since. */
  unchanged(z: FileZone): boolean {
    const c = this.counts(z);
    for (let i = 0; i < z.vpkgs.length; i++) if ((c?.[z.vpkgs[i]!] ?? z.seen[i]) !== z.seen[i]) return false;
    return true;
  }

  /** Whether the daemon wrote the VM's values (not only the times of an idle interval) since the last call. */
  valuesMoved(): boolean {
    const moved = this.copy.valuesWritten !== this.valuesSeen;
    this.valuesSeen = this.copy.valuesWritten;
    return moved;
  }

  /** The file `file` in `dir`, made now (over an older one) and written by the daemon from then on; null when `open` cannot. */
  static create(dir: SafeDir, file: string, open: OpenStatsCopy): GuestStatsFile | null {
    let made: ReturnType<SafeDir['mapped']> | null = null;
    const copy = open((bytes) => (made = dir.mapped(file, bytes)).mapping.memory);
    if (copy === null || made === null) return null;
    const m: ReturnType<SafeDir['mapped']> = made;
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
