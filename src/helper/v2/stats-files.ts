/**
 * The statistics files (docs/stats-fd.md): one per VM a reader asked for, and one of the host, each a
 * PublishedFile (a sealed memfd mapped by the daemon alone) written once per sample whatever the
 * number of readers, through the seqlock of SampleBlock. A file is made at the first STATS_FD of its
 * VM and kept while the VM is known; when the VM ends it is written a last time (ended = 1) and no
 * more; when the VM is dropped the daemon closes its own fd and mapping, and readers keep theirs.
 * When a VM's vCPU list changes shape (count of vCPUs or virtual packages), its file is written a
 * last time with replaced = 1 and a new one is made for the next STATS_FD.
 */
import type { Logger } from 'pino';
import { cannot } from '../../common/errors.js';
import { fail, ok, type Result } from '../../common/result.js';
import { PublishedFile } from '../../os/published-file.js';
import { realtimeNs } from '../../os/libc.js';
import { encodeStatsFile, type StatsLayout } from '../../protocol/stats/layout.js';
import { SampleBlock } from '../../protocol/stats/sample-block.js';
import {
  hostDomainShapes,
  hostStatsLayout,
  writeHostStats,
  type HostCapacity,
  type HostDomainShape,
  type HostStatsValues,
} from '../../protocol/stats/host-file.js';
import {
  tickExponent,
  vmStatsLayout,
  VmStatsSlots,
  writeVmStats,
  type VcpuTotals,
  type VmStatsShape,
  type VmStatsValues,
} from '../../protocol/stats/vm-file.js';
import { E, type HostValues } from '../../protocol/v2/codec.js';
import type { SampleEvent, SamplingService } from '../../sampling/sampling-service.js';
import type { VmInterval, VmOutput } from '../../ratio/outputs.js';
import type { ThreadTotals } from '../../ratio/attribution.js';
import type { OtherDomain } from '../../model/domains.js';
import type { FdAdmitter, VmRegistry } from './vm-registry.js';

/** What the files read of the sampling loop. */
type StatsSampling = Pick<SamplingService, 'output' | 'threadTotals' | 'running'>;

interface StatsFilesParts {
  registry: Pick<VmRegistry, 'get'>;
  sampling: StatsSampling;
  intervalNs: bigint;
  clkTck: number;
  /** HOST_UPDATE's values now (per-package unattributed energy included). */
  hostValues(): HostValues;
  fds?: FdAdmitter;
  log: Logger;
  /** CLOCK_MONOTONIC now, the loop's clock (for the realtime of a sample). */
  clock: () => bigint;
  /** The energy source's code for the host file (ENERGY_SOURCE_CODE); 0 when the caller does not say. */
  energySourceCode?: number;
  /** The VM caps and the fd budget now, for the host file; its null parts are left out of the file. */
  capacity?: () => HostCapacity;
  /**
   * The other RAPL domains' totals per package (HostEnergy.domainsUj): every domain the host reads,
   * from the start (the host file is laid out with the ones there when it is made). Absent: none.
   */
  hostDomains?: () => NonNullable<HostStatsValues['domains']>;
  /** --guest-energy exact: a VM's guest energy against its exact energy (J), undefined while it is not exact. */
  guest?: (vmId: number) => { guestJ: number; exactJ: number } | undefined;
}

/** A refusal, with the v2 error code it is answered with. */
interface StatsRefusal {
  code: number;
  message: string;
}

/** A VM's values as written, refilled in place at each sample (writeVm). */
interface VmValues extends VmStatsValues {
  energyUj: bigint[];
  counter: number[];
  vcpus: VcpuTotals[];
  domains: { domain: OtherDomain; energyUj: readonly bigint[]; powerUw: readonly number[] }[];
}

const NONE: readonly never[] = [];

/** `a` cut to `n` items when longer (an array's length set only when it changes: setting it is a slow call in V8). */
function fit(a: unknown[], n: number): void {
  if (a.length > n) a.length = n;
}

interface VmFile {
  file: PublishedFile;
  block: SampleBlock;
  slots: VmStatsSlots;
  /**
   * Its values and their writing (writeVmStats of them), made once: every VM's file is written at
   * every interval (each VM with a guest directory has one), so nothing is allocated for it per sample.
   */
  values: VmValues;
  fill: (b: SampleBlock) => void;
  /** Written with ended = 1: nothing more changes. */
  final: boolean;
  /** Power per vpkg over the last interval, µW (0 until the file's first interval). */
  powerUw: number[];
  /** The same per other domain of the file. */
  domainPowerUw: Map<string, number[]>;
  intervalNs: bigint;
}

interface HostFile {
  file: PublishedFile;
  block: SampleBlock;
  domains: HostDomainShape[];
}

export class StatsFiles {
  private readonly vms = new Map<number, VmFile>();
  private host: HostFile | null = null;
  private lastTimes = { monotonicNs: 0n, realtimeNs: 0n, intervalNs: 0n };
  /** The last sample's interval, so that a file made between samples has its power and interval at once. */
  private lastResult: SampleEvent['result'] = null;
  private vmChanges = 0n;

  constructor(private readonly p: StatsFilesParts) {}

  /** Files the daemon holds open now (one fd each). */
  get open(): number {
    return this.vms.size + (this.host ? 1 : 0);
  }

  /** VM `vmId`'s file, made now if it has none; the caller checked the peer may see it. */
  vm(vmId: number): Result<PublishedFile, StatsRefusal> {
    const have = this.vms.get(vmId);
    if (have) return ok(have.file);
    const r = this.p.registry.get(vmId);
    const out = this.p.sampling.output(vmId);
    if (!r || !out) return fail({ code: E.NO_SUCH, message: `no VM ${vmId}` });
    const shape = this.shapeOf(vmId, r.pid, r.name);
    const made = this.make(`vmsr-vm-${vmId}`, vmStatsLayout(shape), `the statistics file of VM ${vmId}`);
    if (!made.ok) return made;
    const block = new SampleBlock(made.value.memory, vmStatsLayout(shape));
    const slots = new VmStatsSlots(block, shape);
    const values: VmValues = {
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
    const f: VmFile = {
      file: made.value,
      block,
      slots,
      values,
      fill: (b) => writeVmStats(b, slots, values),
      final: false,
      powerUw: [],
      domainPowerUw: new Map(),
      intervalNs: 0n,
    };
    const last = this.lastResult?.vms.find((v) => v.vmId === vmId);
    if (last && this.lastResult) this.setInterval(f, last, this.lastResult.dtS);
    this.vms.set(vmId, f);
    this.writeVm(vmId, f);
    return ok(f.file);
  }

  /** The host's file, made now if there is none. */
  hostFile(): Result<PublishedFile, StatsRefusal> {
    if (this.host) return ok(this.host.file);
    const c = this.p.capacity?.();
    const domains = hostDomainShapes(this.p.hostDomains?.() ?? []);
    const layout = hostStatsLayout(process.pid, this.p.hostValues().packages.length, {
      capacity: { discovered: (c?.discovered ?? null) !== null, fds: (c?.fds ?? null) !== null },
      domains,
    });
    const made = this.make('vmsr-host', layout, "the host's statistics file");
    if (!made.ok) return made;
    this.host = { file: made.value, block: new SampleBlock(made.value.memory, layout), domains };
    this.writeHost();
    return ok(this.host.file);
  }

  /** Fds one more reader's copy needs, checked against the budget (the copy lives until the reply went out). */
  canHandOut(what: string): Result<void, StatsRefusal> {
    const fit = this.p.fds?.canOpen?.(1, what);
    if (fit && !fit.ok) return fail({ code: E.LIMIT, message: cannot(`hand out ${what}`, fit.error) });
    return ok(undefined);
  }

  /** One sample (`vmsChanged`: a VM appeared, ended or was dropped with it): every file once. */
  sample(ev: SampleEvent, vmsChanged = false): void {
    if (vmsChanged) this.vmChanges++;
    const dtNs = ev.result ? BigInt(Math.round(ev.result.dtS * 1e9)) : 0n;
    this.lastTimes = { monotonicNs: ev.tNs, realtimeNs: ev.tNs + (realtimeNs() - this.p.clock()), intervalNs: dtNs };
    this.lastResult = ev.result;
    if (ev.result && this.vms.size > 0) {
      for (const v of ev.result.vms) {
        const f = this.vms.get(v.vmId);
        if (f) this.setInterval(f, v, ev.result.dtS);
      }
    }
    for (const [vmId, f] of this.vms) if (!f.final) this.writeVm(vmId, f);
    if (this.host) this.writeHost();
  }

  /** A VM's power over the interval (energy / measured length), per domain too, and the interval's length. */
  private setInterval(f: VmFile, v: VmInterval, dtS: number): void {
    // In place: the arrays of the last interval take this one's values.
    const uw = (to: number[], vpkgEnergyJ: readonly number[]) => {
      fit(to, vpkgEnergyJ.length);
      for (let g = 0; g < vpkgEnergyJ.length; g++) to[g] = dtS > 0 ? (vpkgEnergyJ[g]! / dtS) * 1e6 : 0;
      return to;
    };
    uw(f.powerUw, v.vpkgEnergyJ);
    for (const d of v.domains ?? []) {
      const to = f.domainPowerUw.get(d.domain);
      if (to === undefined) f.domainPowerUw.set(d.domain, uw([], d.vpkgEnergyJ));
      else uw(to, d.vpkgEnergyJ);
    }
    f.intervalNs = BigInt(Math.round(dtS * 1e9));
  }

  /** The VM is gone from the daemon: its file was written for the last time; the daemon lets go of it. */
  dropped(vmId: number): void {
    const f = this.vms.get(vmId);
    if (!f) return;
    if (!f.final) this.finish(f, 'ended');
    f.file.close();
    this.vms.delete(vmId);
  }

  /**
   * The daemon stops: every file is written a last time with next_sample_monotonic 0 (no sample is
   * coming) and let go. `ended` is not set: the VMs did not end, the helper did.
   */
  close(): void {
    for (const f of this.vms.values()) {
      if (!f.final) this.finish(f, 'stopped');
      f.file.close();
    }
    this.vms.clear();
    if (this.host) this.host.block.write((b) => b.setNumber(b.slot('next_sample_monotonic'), 0));
    this.host?.file.close();
    this.host = null;
  }

  private shapeOf(vmId: number, pid: number, name: string | null): VmStatsShape {
    const out = this.p.sampling.output(vmId);
    const threads = this.p.sampling.threadTotals(vmId);
    return {
      hostVmId: vmId,
      pid,
      name,
      nvpkg: Math.max(1, out?.vpkgs.length ?? 1),
      nvcpu: Math.max(1, threads?.vcpus.length ?? 1),
      tickExponent: tickExponent(this.p.clkTck),
      domains: (out?.domains ?? []).map((d) => d.domain),
      guest: this.p.guest !== undefined,
    };
  }

  private make(name: string, layout: StatsLayout, what: string): Result<PublishedFile, StatsRefusal> {
    // Its own fd, and the reader's copy until the reply went out.
    const fit = this.p.fds?.canOpen?.(2, what);
    if (fit && !fit.ok) return fail({ code: E.LIMIT, message: cannot(`make ${what}`, fit.error) });
    try {
      return ok(PublishedFile.create(name, encodeStatsFile(layout)));
    } catch (e) {
      this.p.log.warn({ err: (e as Error).message }, 'statistics file not made');
      return fail({
        code: E.LIMIT,
        message: cannot(`make ${what}`, (e as Error).message, "raise the helper's open-file limit (LimitNOFILE=)"),
      });
    }
  }

  private writeVm(vmId: number, f: VmFile): void {
    const out = this.p.sampling.output(vmId);
    const threads = this.p.sampling.threadTotals(vmId);
    if (!out) return;
    const shape = f.slots.shape;
    if (out.vpkgs.length !== shape.nvpkg || (threads !== undefined && threads.vcpus.length !== shape.nvcpu)) {
      // The vCPU list changed shape: this file stops here; the next STATS_FD makes one that fits.
      this.finish(f, 'replaced');
      f.file.close();
      this.vms.delete(vmId);
      return;
    }
    this.refill(vmId, f, out, threads);
    f.block.write(f.fill);
    if (out.ended) f.final = true;
  }

  /** The file's values now, into its values in place (the arrays and objects of the last sample reused). */
  private refill(vmId: number, f: VmFile, out: VmOutput, threads: ThreadTotals | undefined): void {
    const v = f.values;
    v.monotonicNs = out.tNs;
    v.realtimeNs =
      out.tNs === 0n ? 0n : out.tNs === this.lastTimes.monotonicNs ? this.lastTimes.realtimeNs : out.tNs + (realtimeNs() - this.p.clock());
    v.nextMonotonicNs = this.p.sampling.running && !out.ended && out.tNs > 0n ? out.tNs + this.p.intervalNs : 0n;
    v.intervalNs = f.intervalNs;
    v.ended = out.ended;
    const vpkgs = out.vpkgs;
    fit(v.energyUj, vpkgs.length);
    fit(v.counter, vpkgs.length);
    for (let g = 0; g < vpkgs.length; g++) {
      v.energyUj[g] = vpkgs[g]!.energyUj;
      v.counter[g] = vpkgs[g]!.counter;
    }
    v.powerUw = out.ended ? NONE : f.powerUw;
    const vcpus = threads?.vcpus ?? NONE;
    fit(v.vcpus, vcpus.length);
    for (let i = 0; i < vcpus.length; i++) {
      const to = (v.vcpus[i] ??= { tid: 0, energyUj: 0, ticks: 0 });
      to.tid = vcpus[i]!.tid;
      to.energyUj = vcpus[i]!.energyJ * 1e6;
      to.ticks = vcpus[i]!.ticks;
    }
    v.otherTicks = threads?.otherTicks ?? 0;
    const domains = out.domains ?? NONE;
    fit(v.domains, domains.length);
    for (let i = 0; i < domains.length; i++) {
      const d = domains[i]!;
      const to = (v.domains[i] ??= { domain: d.domain, energyUj: NONE, powerUw: NONE });
      to.domain = d.domain;
      to.energyUj = d.vpkgEnergyUj;
      to.powerUw = out.ended ? NONE : (f.domainPowerUw.get(d.domain) ?? NONE);
    }
    const g = this.p.guest?.(vmId);
    v.guest = g === undefined ? undefined : { guestUj: g.guestJ * 1e6, exactUj: g.exactJ * 1e6 };
  }

  private finish(f: VmFile, why: 'ended' | 'replaced' | 'stopped'): void {
    f.block.write((b) => {
      b.setNumber(f.slots.ended, why === 'ended' ? 1 : Number(b.get(f.slots.ended)));
      if (why === 'replaced') b.setNumber(f.slots.replaced, 1);
      b.setNumber(b.slot('next_sample_monotonic'), 0);
      for (let g = 0; g < f.slots.shape.nvpkg; g++) {
        b.setNumber(f.slots.power + g, 0);
        for (const at of f.slots.domains.values()) b.setNumber(at.power + g, 0);
      }
    });
    f.final = true;
  }

  private writeHost(): void {
    const h = this.host;
    if (!h) return;
    const v = this.p.hostValues();
    const values: HostStatsValues = {
      monotonicNs: v.tNs,
      realtimeNs:
        v.tNs === 0n ? 0n : v.tNs === this.lastTimes.monotonicNs ? this.lastTimes.realtimeNs : v.tNs + (realtimeNs() - this.p.clock()),
      nextMonotonicNs: this.p.sampling.running && v.tNs > 0n ? v.tNs + this.p.intervalNs : 0n,
      intervalNs: this.lastTimes.intervalNs,
      packages: v.packages.map((k) => ({ pkg: k.pkg, energyUj: k.energyUj, unattributedUj: k.unattributedUj ?? 0n })),
      unattributedUj: v.unattributedUj,
      vmChanges: this.vmChanges,
      ...v.stats,
      energySource: this.p.energySourceCode ?? 0,
      ...(this.p.capacity ? { capacity: this.p.capacity() } : {}),
      ...(h.domains.length > 0 && this.p.hostDomains ? { domains: this.p.hostDomains() } : {}),
    };
    h.block.write((b) => writeHostStats(b, values, h.domains));
  }
}
