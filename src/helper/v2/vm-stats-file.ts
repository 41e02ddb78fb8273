/** One VM's statistics file (docs/stats-fd.md "A VM's file"): values refilled in place each sample, written into every copy alike. */
import { fitLength } from '../../common/fit-length.js';
import type { PublishedFile } from '../../os/published-file.js';
import { encodeStatsFile, type StatsLayout } from '../../protocol/stats/layout.js';
import { SampleBlock } from '../../protocol/stats/sample-block.js';
import {
  vmStatsLayout,
  vmStatsSlots,
  type VmStatsSlots,
  writeVmInterval,
  writeVmStats,
  type VcpuTotals,
  type VmStatsShape,
  type VmStatsValues,
} from '../../protocol/stats/vm-file.js';
import type { SamplingService } from '../../sampling/sampling-service.js';
import { emptyVmTotals, type VmInterval, type VmTotals } from '../../ratio/outputs.js';
import type { PowerLimitView } from '../../power-limit/limiter.js';
import type { OtherDomain } from '../../model/domains.js';

export interface VmStatsReads {
  sampling: Pick<SamplingService, 'engine'>;
  /** CLOCK_REALTIME of a sample taken at CLOCK_MONOTONIC `tNs` (0 for 0). */
  realtimeOf(tNs: bigint): bigint;
  /** CLOCK_MONOTONIC at which the sample after the one at `tNs` is expected (0: none is). */
  nextOf(tNs: bigint): bigint;
  /** --guest-energy exact's figures of a VM, undefined while it is not exact. */
  guest?: (vmId: number) => { guestJ: number; exactJ: number; garbageWindows: number; garbageJ: number } | undefined;
  /** Power limits: a VM's limits (one per domain), empty when it has none; absent, the files have no power limit descriptors. */
  powerLimit?: (vmId: number) => PowerLimitView[];
}

/** A VM's values as written, refilled in place at each sample. */
interface VmValues extends VmStatsValues {
  vcpus: VcpuTotals[];
  domains: { domain: OtherDomain; energyUj: readonly number[]; powerUw: readonly number[] }[];
}

/** Why a file is written for the last time. */
export type FinishCause = 'ended' | 'replaced' | 'stopped';

const NONE: readonly never[] = [];

/** Power per virtual package over an interval of `dtS` seconds, µW, into `to` (0 for an interval of no length). */
function powerInto(to: number[], vpkgEnergyJ: readonly number[], dtS: number): number[] {
  fitLength(to, vpkgEnergyJ.length);
  for (let g = 0; g < vpkgEnergyJ.length; g++) to[g] = dtS > 0 ? (vpkgEnergyJ[g]! / dtS) * 1e6 : 0;
  return to;
}

/** A copy of the file in memory the caller mapped (the guest's file): written at each sample while `current`. */
export class VmStatsCopy {
  /** Written at each sample; false once closed, or once the daemon stopped writing the VM's file (dropped, replaced). */
  current = true;
  /** Samples written whole (the VM's totals, not only the times and power of an idle interval): unchanged, nothing moved. */
  valuesWritten = 0;

  constructor(
    readonly shape: VmStatsShape,
    /** The file's values (refilled in place at each sample): the guest's tree takes its own from them. */
    readonly totals: VmTotals,
    readonly block: SampleBlock,
    private readonly onClose: (c: VmStatsCopy) => void,
  ) {}

  /** Never written again (call it before unmapping the memory). */
  close(): void {
    if (!this.current) return;
    this.current = false;
    this.onClose(this);
  }
}

export class VmStatsFile {
  readonly layout: StatsLayout;
  readonly slots: VmStatsSlots;
  private readonly values: VmValues = {
    monotonicNs: 0n,
    realtimeNs: 0n,
    nextMonotonicNs: 0n,
    intervalNs: 0n,
    ended: false,
    energyUj: [],
    counter: [],
    powerUw: [],
    vcpus: [],
    otherTicks: 0,
    domains: [],
    guest: undefined,
  };
  private readonly fill = (b: SampleBlock) => writeVmStats(b, this.slots, this.values);
  private readonly fillInterval = (b: SampleBlock) => writeVmInterval(b, this.slots, this.values);
  /** The engine's count of the VM's changes every copy's values were last written with (-1: none yet). */
  private writtenAt = -1;
  /** The engine's totals of the VM, refilled in place by it at each sample (RatioEngine.totalsInto). */
  private readonly totals: VmTotals = emptyVmTotals();
  /** Written with ended = 1 (or for the last time): nothing more changes. */
  final = false;
  /** Power per vpkg over the last interval, µW (0 until the file's first interval), and the same per other domain. */
  private readonly powerUw: number[] = [];
  private readonly domainPowerUw = new Map<string, number[]>();
  private intervalNs = 0n;
  /** The memfd STATS_FD hands out; null until a reader asked. */
  file: PublishedFile | null = null;
  /** Every copy written at a sample: the memfd's block (once made) and the guests' copies' blocks. */
  private readonly blocks: SampleBlock[] = [];
  private readonly copies: VmStatsCopy[] = [];

  constructor(
    readonly vmId: number,
    shape: VmStatsShape,
    private readonly p: VmStatsReads,
  ) {
    this.layout = vmStatsLayout(shape);
    this.slots = vmStatsSlots(new SampleBlock(new ArrayBuffer(this.layout.fileSize), this.layout), shape);
  }

  /** Neither a memfd nor a guest's copy: nothing to write. */
  get unused(): boolean {
    return this.file === null && this.copies.length === 0;
  }

  /** The whole file with the values now (a new copy's first contents: a reader never sees it empty). */
  bytesNow(): Buffer {
    const memory = new ArrayBuffer(this.layout.fileSize);
    new Uint8Array(memory).set(encodeStatsFile(this.layout));
    if (this.p.sampling.engine.totalsInto(this.vmId, this.totals)) this.refill();
    new SampleBlock(memory, this.layout).write(this.fill);
    return Buffer.from(memory);
  }

  /** The memfd made of bytesNow(), written from now on. */
  addFile(file: PublishedFile): void {
    this.file = file;
    this.blocks.push(new SampleBlock(file.memory, this.layout));
  }

  /** A copy in `memory` (made of bytesNow()), written from now on; `closed` is told when it is closed. */
  addCopy(memory: ArrayBuffer, closed: () => void): VmStatsCopy {
    const c = new VmStatsCopy(this.slots.shape, this.totals, new SampleBlock(memory, this.layout), (gone) => {
      this.copies.splice(this.copies.indexOf(gone), 1);
      this.blocks.splice(this.blocks.indexOf(gone.block), 1);
      closed();
    });
    this.copies.push(c);
    this.blocks.push(c.block);
    return c;
  }

  /**
   * One sample's values into every copy: when the totals did not move (an idle interval, not exact mode),
   * its times and power alone. False, writing nothing, when the vCPUs or virtual packages no longer fit the file.
   */
  write(): boolean {
    const t = this.totals;
    if (!this.p.sampling.engine.totalsInto(this.vmId, t)) return true;
    if (t.energyUj.length !== this.slots.shape.nvpkg || t.vcpus.length !== this.slots.shape.nvcpu) return false;
    const whole = t.changes !== this.writtenAt || this.p.guest !== undefined;
    if (whole) this.refill();
    else this.refillTimes();
    const fill = whole ? this.fill : this.fillInterval;
    for (let i = 0; i < this.blocks.length; i++) this.blocks[i]!.write(fill);
    if (whole) for (const c of this.copies) c.valuesWritten++;
    this.writtenAt = t.changes;
    if (t.ended) this.final = true;
    return true;
  }

  /** A VM's power over the interval (energy / measured length), per domain too, and the interval's length. */
  setInterval(v: VmInterval, dtS: number, dtNs: bigint): void {
    // In place: the arrays of the last interval take this one's values.
    powerInto(this.powerUw, v.vpkgEnergyJ, dtS);
    for (const d of v.domains ?? []) {
      const to = this.domainPowerUw.get(d.domain);
      if (to === undefined) this.domainPowerUw.set(d.domain, powerInto([], d.vpkgEnergyJ, dtS));
      else powerInto(to, d.vpkgEnergyJ, dtS);
    }
    this.intervalNs = dtNs;
  }

  /** Every copy written a last time (`ended` set for an ended VM, `replaced` for a new shape); nothing more is written. */
  finish(why: FinishCause): void {
    const s = this.slots;
    const last = (b: SampleBlock) => {
      b.setNumber(s.ended, why === 'ended' ? 1 : Number(b.get(s.ended)));
      if (why === 'replaced') b.setNumber(s.replaced, 1);
      b.setNumber(b.slot('next_sample_monotonic'), 0);
      for (let g = 0; g < s.shape.nvpkg; g++) {
        b.setNumber(s.power + g, 0);
        for (const at of s.domains.values()) b.setNumber(at.power + g, 0);
      }
    };
    for (const b of this.blocks) b.write(last);
    this.final = true;
  }

  /** The daemon lets go: its memfd closed (readers keep theirs), the guests' copies written no more. */
  close(): void {
    this.file?.close();
    this.file = null;
    for (const c of this.copies) c.current = false;
    this.copies.length = 0;
    this.blocks.length = 0;
  }

  /** The file's values from the engine's totals (read() just before), in place (the arrays and objects of the last sample reused). */
  private refill(): void {
    const v = this.values;
    const t = this.totals;
    this.refillTimes();
    v.ended = t.ended;
    // The engine's arrays, refilled by it in place.
    v.energyUj = t.energyUj;
    v.counter = t.counter;
    v.powerUw = t.ended ? NONE : this.powerUw;
    fitLength(v.vcpus, t.vcpus.length);
    for (let i = 0; i < t.vcpus.length; i++) {
      const to = (v.vcpus[i] ??= { tid: 0, energyUj: 0, ticks: 0 });
      to.tid = t.vcpus[i]!.tid;
      to.energyUj = t.vcpus[i]!.energyJ * 1e6;
      to.ticks = t.vcpus[i]!.ticks;
    }
    v.otherTicks = t.otherTicks;
    fitLength(v.domains, t.domains.length);
    for (let i = 0; i < t.domains.length; i++) {
      const d = t.domains[i]!;
      const to = (v.domains[i] ??= { domain: d.domain, energyUj: NONE, powerUw: NONE });
      to.domain = d.domain;
      to.energyUj = d.energyUj;
      to.powerUw = t.ended ? NONE : (this.domainPowerUw.get(d.domain) ?? NONE);
    }
    const g = this.p.guest?.(this.vmId);
    v.guest =
      g === undefined
        ? undefined
        : { guestUj: g.guestJ * 1e6, exactUj: g.exactJ * 1e6, garbageWindows: g.garbageWindows, garbageUj: g.garbageJ * 1e6 };
  }

  /** The sample's times and the interval's length (the power arrays are refilled in place by setInterval). */
  private refillTimes(): void {
    const v = this.values;
    const t = this.totals;
    v.monotonicNs = t.tNs;
    v.realtimeNs = this.p.realtimeOf(t.tNs);
    v.nextMonotonicNs = t.ended ? 0n : this.p.nextOf(t.tNs);
    v.intervalNs = this.intervalNs;
    const limits = this.p.powerLimit?.(this.vmId) ?? [];
    const l = limits[0];
    v.powerLimit =
      l === undefined
        ? undefined
        : {
            limitsMw: new Map(limits.map((x) => [x.domain, Math.round(x.limitW * 1000)])),
            quotaMilliCpus: l.quotaUs === null ? 0 : Math.round((l.quotaUs / l.periodUs) * 1000),
            limitedMs: Math.round(l.limitedS * 1000),
          };
  }
}
