/** The statistics files (docs/stats-fd.md): each VM's a reader or a guest asked for, and the host's, each written once per sample. */
import type { Logger } from 'pino';
import { cannot } from '../../common/errors.js';
import { fail, ok, type Result } from '../../common/result.js';
import { PublishedFile } from '../../os/published-file.js';
import { realtimeNs } from '../../os/libc/processes.js';
import { encodeStatsFile } from '../../protocol/stats/layout.js';
import { SampleBlock } from '../../protocol/stats/sample-block.js';
import {
  hostDomainShapes,
  hostStatsLayout,
  writeHostStats,
  type HostCapacity,
  type HostDomainShape,
  type HostStatsValues,
} from '../../protocol/stats/host-file.js';
import { tickExponent, type VmStatsShape } from '../../protocol/stats/vm-file.js';
import { E, type HostValues } from '../../protocol/v2/codec.js';
import type { SampleEvent, SamplingService } from '../../sampling/sampling-service.js';
import { emptyVmTotals } from '../../ratio/outputs.js';
import type { FdAdmitter, VmRegistry } from './vm-registry.js';
import { VmStatsFile, type FinishCause, type VmStatsCopy, type VmStatsReads } from './vm-stats-file.js';

interface StatsFilesParts extends Pick<VmStatsReads, 'guest' | 'powerLimit'> {
  registry: Pick<VmRegistry, 'get'>;
  sampling: Pick<SamplingService, 'engine' | 'running'>;
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
  /** The other RAPL domains' totals per package (the host file is laid out with the ones there when made). */
  hostDomains?: () => NonNullable<HostStatsValues['domains']>;
}

type StatsRefusal = { code: number; message: string };

export class StatsFiles {
  private readonly vms = new Map<number, VmStatsFile>();
  private host: { file: PublishedFile; block: SampleBlock; domains: HostDomainShape[] } | null = null;
  /** The last sample's times (worked out once for every file written with it). */
  private lastTimes = { monotonicNs: 0n, realtimeNs: 0n, intervalNs: 0n, nextNs: 0n };
  /** The last sample's interval, so that a file made between samples has its power and interval at once. */
  private lastResult: SampleEvent['result'] = null;
  private vmChanges = 0n;

  constructor(private readonly p: StatsFilesParts) {}

  /** VM `vmId`'s memfd (STATS_FD), made now if it has none; the caller checked the peer may see it. */
  vm(vmId: number): Result<PublishedFile, StatsRefusal> {
    const f = this.vmFile(vmId);
    if (f === null) return fail({ code: E.NO_SUCH, message: `no VM ${vmId}` });
    if (f.file !== null) return ok(f.file);
    const made = this.make(`vmsr-vm-${vmId}`, () => f.bytesNow(), `the statistics file of VM ${vmId}`);
    if (!made.ok) {
      if (f.unused) this.vms.delete(vmId);
      return made;
    }
    f.addFile(made.value);
    return ok(made.value);
  }

  /** VM `vmId`'s file written into the shared mapping `map` returns (the guest's file), from now on; null for no such VM. */
  copy(vmId: number, map: (bytes: Buffer) => ArrayBuffer): VmStatsCopy | null {
    const f = this.vmFile(vmId);
    if (f === null) return null;
    let memory: ArrayBuffer;
    try {
      memory = map(f.bytesNow());
    } catch (e) {
      if (f.unused) this.vms.delete(vmId);
      throw e;
    }
    return f.addCopy(memory, () => {
      if (f.unused && this.vms.get(vmId) === f) this.vms.delete(vmId);
    });
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
    const made = this.make('vmsr-host', () => encodeStatsFile(layout), "the host's statistics file");
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
    const realtime = ev.tNs + (realtimeNs() - this.p.clock());
    this.lastTimes = { monotonicNs: ev.tNs, realtimeNs: realtime, intervalNs: dtNs, nextNs: ev.tNs + this.p.intervalNs };
    this.lastResult = ev.result;
    if (ev.result && this.vms.size > 0) for (const v of ev.result.vms) this.vms.get(v.vmId)?.setInterval(v, ev.result.dtS, dtNs);
    // A vCPU list that changed shape ends the file; the next STATS_FD (or guest copy) makes one that fits.
    for (const f of this.vms.values()) if (!f.final && !f.write()) this.release(f, 'replaced');
    if (this.host) this.writeHost();
  }

  /** The VM is gone from the daemon: its file was written for the last time; the daemon lets go of it. */
  dropped(vmId: number): void {
    const f = this.vms.get(vmId);
    if (f) this.release(f, 'ended');
  }

  /** The daemon stops: every file written a last time with next_sample_monotonic 0, not `ended` (the helper ended, not the VMs). */
  close(): void {
    for (const f of [...this.vms.values()]) this.release(f, 'stopped');
    if (this.host) this.host.block.write((b) => b.setNumber(b.slot('next_sample_monotonic'), 0));
    this.host?.file.close();
    this.host = null;
  }

  /** The VM's file, its values kept from now on (made if it has none), or null for no such VM. */
  private vmFile(vmId: number): VmStatsFile | null {
    const have = this.vms.get(vmId);
    if (have) return have;
    const r = this.p.registry.get(vmId);
    const now = emptyVmTotals();
    if (!r || !this.p.sampling.engine.totalsInto(vmId, now)) return null;
    const shape: VmStatsShape = {
      hostVmId: vmId,
      pid: r.pid,
      name: r.name,
      nvpkg: Math.max(1, now.energyUj.length),
      nvcpu: Math.max(1, now.vcpus.length),
      tickExponent: tickExponent(this.p.clkTck),
      domains: now.domains.map((d) => d.domain),
      guest: this.p.guest !== undefined,
      powerLimit: this.p.powerLimit !== undefined,
    };
    const f = new VmStatsFile(vmId, shape, {
      sampling: this.p.sampling,
      realtimeOf: (tNs) => this.realtimeOf(tNs),
      nextOf: (tNs) => this.nextOf(tNs),
      guest: this.p.guest,
      powerLimit: this.p.powerLimit,
    });
    const last = this.lastResult?.vms.find((v) => v.vmId === vmId);
    if (last && this.lastResult) f.setInterval(last, this.lastResult.dtS, this.lastTimes.intervalNs);
    this.vms.set(vmId, f);
    return f;
  }

  /** CLOCK_REALTIME of the sample taken at CLOCK_MONOTONIC `tNs` (0 for none). */
  private realtimeOf(tNs: bigint): bigint {
    if (tNs === 0n) return 0n;
    return tNs === this.lastTimes.monotonicNs ? this.lastTimes.realtimeNs : tNs + (realtimeNs() - this.p.clock());
  }

  /** CLOCK_MONOTONIC at which the sample after the one taken at `tNs` is expected; 0 when none is (the loop idle, no sample yet). */
  private nextOf(tNs: bigint): bigint {
    if (!this.p.sampling.running || tNs === 0n) return 0n;
    return tNs === this.lastTimes.monotonicNs ? this.lastTimes.nextNs : tNs + this.p.intervalNs;
  }

  /** A file written a last time (unless it was) and let go: its memfd closed, its guests' copies no longer written. */
  private release(f: VmStatsFile, why: FinishCause): void {
    if (!f.final) f.finish(why);
    f.close();
    if (this.vms.get(f.vmId) === f) this.vms.delete(f.vmId);
  }

  private make(name: string, bytes: () => Buffer, what: string): Result<PublishedFile, StatsRefusal> {
    // Its own fd, and the reader's copy until the reply went out.
    const fit = this.p.fds?.canOpen?.(2, what);
    if (fit && !fit.ok) return fail({ code: E.LIMIT, message: cannot(`make ${what}`, fit.error) });
    try {
      return ok(PublishedFile.create(name, bytes()));
    } catch (e) {
      this.p.log.warn({ err: (e as Error).message }, 'statistics file not made');
      return fail({
        code: E.LIMIT,
        message: cannot(`make ${what}`, (e as Error).message, "raise the helper's open-file limit (LimitNOFILE=)"),
      });
    }
  }

  private writeHost(): void {
    const h = this.host;
    if (!h) return;
    const v = this.p.hostValues();
    const values: HostStatsValues = {
      monotonicNs: v.tNs,
      realtimeNs: this.realtimeOf(v.tNs),
      nextMonotonicNs: this.nextOf(v.tNs),
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
