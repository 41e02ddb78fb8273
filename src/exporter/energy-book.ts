/**
 * The exporter's picture of the host, fed by a v2 connection, read by the metrics at scrape time; pure state (clock injected).
 * A series is its labels (name, uuid, pid, uid): a VM keeps its totals across a daemon restart, another process under the
 * same labels (another starttime) starts afresh. An ended VM is in one more scrape, then forgotten (or after `endedRetentionMs`).
 */
import type { HostUpdate, VmInfo, VmUpdate } from '../client/v2-replies.js';
import { RunningTotal } from './running-total.js';
import { DEFAULT_MAX_DISCOVERED_VMS } from '../discovery/discovery-limits.js';
import { DEFAULT_V2_LIMITS } from '../helper/v2/v2-limits.js';
import type { EnergySourceKind } from '../energy/kinds.js';
import type { HelperCapacity } from './helper-capacity.js';
import type { EnergyDomain, OtherDomain } from '../model/domains.js';
import { wattsOver } from '../common/watts.js';
import type { HostDomainValues } from '../protocol/v2/codec.js';

/** A VM's other RAPL domain in one sample of its statistics file: per vpkg, cumulative µJ and the last interval's W. */
interface VmDomainStats {
  domain: OtherDomain;
  energyUj: readonly bigint[];
  powerW: readonly number[];
}

/** A VM's guest energy in one sample of its statistics file (`guest_energy`, `guest_exact_energy`, µJ). */
interface VmGuestValues {
  guestUj: bigint;
  exactUj: bigint;
  /** `guest_garbage_windows` and `guest_garbage_energy` (µJ), absent from files of older daemons. */
  garbageWindows?: bigint;
  garbageUj?: bigint;
}

/** A VM's power limits in one sample of its statistics file (`power_limit`, `<domain>_power_limit` mW; `power_limited_time` ms). */
interface VmLimitValues {
  limitsMw: ReadonlyMap<EnergyDomain, bigint>;
  limitedMs: bigint;
}

/**
 * VMs observed at once (more are skipped, so the series stay bounded): every VM a daemon with default
 * limits can list; each has at most 2 x 256 vpkgs x 5 domains + 1 series. How long an unscraped ended VM stays.
 */
export const DEFAULT_BOOK_LIMITS = {
  maxExportedVms: DEFAULT_MAX_DISCOVERED_VMS + DEFAULT_V2_LIMITS.maxVms,
  endedRetentionMs: 5 * 60_000,
};
type BookLimits = typeof DEFAULT_BOOK_LIMITS;

export interface VmLabels {
  name: string;
  uuid: string;
  pid: string;
  /** Its process's owner: what tells a VM from another user's process wearing its name and UUID. */
  uid: string;
}

/** A VM as the exporter books it: its labels and running totals, kept across daemon restarts by key. */
export interface BookedVm {
  readonly key: string;
  readonly labels: VmLabels;
  /** /proc/<pid>/stat starttime: with the pid, names the process across daemon restarts. */
  readonly starttime: bigint;
  source: VmInfo['source'];
  wholeVmOnly: boolean;
  /** Not every thread of its process is sampled (the helper's LIST flag NOT_WHOLE): its energy is a lower bound. */
  notWhole: boolean;
  /** Its id on the current connection; null until a LIST on that connection names it. */
  hostVmId: number | null;
  readonly energy: RunningTotal[];
  /** Watts over the last interval per vpkg; null until two samples on one connection. */
  watts: (number | null)[];
  /** The other RAPL domains' totals and watts per vpkg (from the statistics files; empty when the host reads the package alone). */
  readonly domainEnergy: Map<OtherDomain, RunningTotal[]>;
  domainWatts: Map<OtherDomain, (number | null)[]>;
  /** --guest-energy exact: what QEMU was given to credit the guest, and the exact energy of the same windows (statistics files only). */
  guest: { guest: RunningTotal; exact: RunningTotal; garbage: RunningTotal; garbageWindows: RunningTotal } | null;
  /** Power limits: each domain's limit that was ever set (W, 0 once removed) and the time limited (ms, accumulated); null until one is set. */
  limit: { watts: Map<EnergyDomain, number>; limitedMs: RunningTotal } | null;
  lastTNs: bigint | null;
  /** Exporter clock (ms) when the VM ended; null while it runs. */
  endedAtMs: number | null;
  /** Set when a scrape has exposed the ended VM: it goes at the end of that scrape. */
  seenEnded: boolean;
}

function vmKey(l: VmLabels): string {
  return `${l.pid}\u0000${l.uid}\u0000${l.uuid}\u0000${l.name}`;
}

function labelsOf(vm: Pick<VmInfo, 'name' | 'uuid' | 'pid' | 'uid'>): VmLabels {
  return { name: vm.name ?? '', uuid: vm.uuid ?? '', pid: String(vm.pid), uid: String(vm.uid) };
}

/** What LIST says of a VM that may change under the same id. */
function flagsOf(vm: VmInfo): Pick<BookedVm, 'source' | 'wholeVmOnly' | 'notWhole'> {
  return { source: vm.source, wholeVmOnly: vm.wholeVmOnly, notWhole: vm.notWhole === true };
}

/** No power known (a new connection, or the VM ended): every vpkg's watts, of every domain, null. */
function noWatts(r: BookedVm): void {
  r.watts.fill(null);
  for (const w of r.domainWatts.values()) w.fill(null);
}

function getOr<K, V>(m: Map<K, V>, key: K, make: () => V): V {
  let v = m.get(key);
  if (v === undefined) m.set(key, (v = make()));
  return v;
}

const totalOf = <K>(m: Map<K, RunningTotal>, key: K): RunningTotal => getOr(m, key, () => new RunningTotal());

export class EnergyBook {
  private readonly vms = new Map<string, BookedVm>();
  /**
   * Ended VMs no longer exposed, kept (at most maxExportedVms, for endedRetentionMs) so that the same process
   * listed again resumes its totals: after a daemon restart a registered VM is missing from LIST until re-registered.
   */
  private readonly resting = new Map<string, BookedVm>();
  private readonly byHostId = new Map<number, BookedVm>();
  readonly packages = new Map<number, RunningTotal>();
  /** Per host package, the energy attributed to no VM (from a helper that sends it; empty otherwise). */
  readonly packageUnattributed = new Map<number, RunningTotal>();
  readonly unattributed = new RunningTotal();
  /** The other RAPL domains, by domain then host package: energy, and the part no VM got (statistics files only). */
  readonly domainPackages = new Map<OtherDomain, Map<number, RunningTotal>>();
  readonly domainPackageUnattributed = new Map<OtherDomain, Map<number, RunningTotal>>();
  /** Per other domain, the energy of all packages no VM got. */
  readonly domainUnattributed = new Map<OtherDomain, RunningTotal>();
  readonly health = {
    connected: false,
    connects: 0,
    legacy: { ok: new RunningTotal(), refused: new RunningTotal(), failed: new RunningTotal() },
    samples: new RunningTotal(),
    sampleFailures: new RunningTotal(),
    /** From the daemon's last host update (null before one): its connections and known VMs. */
    daemonConnections: null as number | null,
    daemonVms: null as number | null,
    lastSampleDurationS: null as number | null,
    /** CLOCK_MONOTONIC (ns) of the daemon's last sample; null before one. */
    lastSampleTNs: null as bigint | null,
    /** VMs not observed because of maxExportedVms or a label set already in use. */
    vmsSkipped: 0,
  };
  /** A host update arrived (host metrics exist from then on). */
  hasHost = false;
  /** Where the daemon's energy comes from, as its host statistics file says; null: not said (or no file). */
  energySource: EnergySourceKind | null = null;
  /** The daemon's VM caps and fd budget, as its host statistics file says; null: not said (or no file). */
  capacity: HelperCapacity | null = null;

  /** `nowMs`: the clock for retention; `monotonicNs`: the daemon's sample clock (CLOCK_MONOTONIC, as process.hrtime). */
  constructor(
    private readonly limits: BookLimits = DEFAULT_BOOK_LIMITS,
    private readonly nowMs: () => number = Date.now,
    private readonly monotonicNs: () => bigint = () => process.hrtime.bigint(),
  ) {}

  /** A new connection: VM ids of the old one mean nothing now; the next LIST re-binds them. */
  connectionStarted(): void {
    this.connectionLost();
    this.health.connected = true;
    this.health.connects++;
  }

  connectionLost(): void {
    this.health.connected = false;
    this.byHostId.clear();
    for (const r of this.vms.values()) {
      r.hostVmId = null;
      r.lastTNs = null;
      noWatts(r);
    }
  }

  /** A LIST reply: binds VMs to this connection's ids, returns those to OBSERVE (new, running, within the cap); unnamed ones ended. */
  listed(list: readonly VmInfo[]): { observe: VmInfo[]; skipped: VmInfo[] } {
    const observe: VmInfo[] = [];
    const skipped: VmInfo[] = [];
    const named = new Set<BookedVm>();
    // An id the LIST no longer has frees its record, for a new id of the same process (labels, starttime) below; else it ends.
    const listedIds = new Set(list.map((vm) => vm.hostVmId));
    for (const [id, r] of this.byHostId) {
      if (listedIds.has(id)) continue;
      this.byHostId.delete(id);
      r.hostVmId = null;
    }
    let live = [...this.vms.values()].filter((r) => r.endedAtMs === null && r.hostVmId !== null).length;
    for (const vm of list) {
      const bound = this.byHostId.get(vm.hostVmId);
      if (bound) {
        named.add(bound);
        // A registration may take over a discovered VM: same id, now registered.
        Object.assign(bound, flagsOf(vm));
        if (vm.ended) this.end(bound);
        continue;
      }
      if (vm.ended) {
        const r = this.vms.get(vmKey(labelsOf(vm)));
        if (r) this.end(r);
        continue;
      }
      const labels = labelsOf(vm);
      let r = this.vms.get(vmKey(labels)) ?? this.revive(vmKey(labels), vm.starttime);
      // Another process under the same labels (pid reused): a new VM, its totals start afresh.
      if (r && r.starttime !== vm.starttime && r.hostVmId === null) {
        this.vms.delete(r.key);
        r = undefined;
      }
      // Two VMs with one label set would be one series: the second is not exposed (nor one over the cap).
      if ((r && r.hostVmId !== null) || live >= this.limits.maxExportedVms) {
        skipped.push(vm);
        continue;
      }
      if (!r) {
        r = {
          key: vmKey(labels),
          labels,
          starttime: vm.starttime,
          ...flagsOf(vm),
          hostVmId: null,
          energy: [],
          watts: [],
          domainEnergy: new Map(),
          guest: null,
          limit: null,
          domainWatts: new Map(),
          lastTNs: null,
          endedAtMs: null,
          seenEnded: false,
        };
        this.vms.set(r.key, r);
      }
      Object.assign(r, flagsOf(vm));
      r.hostVmId = vm.hostVmId;
      r.endedAtMs = null;
      r.seenEnded = false;
      this.byHostId.set(vm.hostVmId, r);
      named.add(r);
      live++;
      observe.push(vm);
    }
    for (const r of this.vms.values()) if (!named.has(r) && r.endedAtMs === null) this.end(r);
    this.health.vmsSkipped = skipped.length;
    return { observe, skipped };
  }

  /** OBSERVE failed for this VM (it ended in between, or we may not see it): it is not ours. */
  unobserved(hostVmId: number): void {
    const r = this.byHostId.get(hostVmId);
    if (r) this.end(r);
  }

  /** Runs before each scrape renders (the stats-fd feed reads the files); whoever sets it logs its failure, the scrape goes on. */
  beforeScrape: (() => Promise<void>) | null = null;

  /** `powerW`: the helper's own W per vpkg (statistics file), else derived; `domains`: the other RAPL domains' values of the sample. */
  vmUpdate(
    u: VmUpdate,
    powerW?: readonly number[],
    domains: readonly VmDomainStats[] = [],
    guest?: VmGuestValues,
    limit?: VmLimitValues,
  ): void {
    const r = this.byHostId.get(u.hostVmId);
    if (!r) return;
    // The same sample twice (OBSERVE's reply and its first callback): nothing new.
    if (u.tNs !== 0n && u.tNs === r.lastTNs && !u.ended) return;
    const dtNs = r.lastTNs !== null && u.tNs > r.lastTNs ? Number(u.tNs - r.lastTNs) : 0;
    // Fewer vpkgs than before (a registrant's vCPU list replaced the discovered one): the series of the ones gone end.
    if (u.vpkgs.length < r.energy.length) {
      r.energy.length = u.vpkgs.length;
      r.watts.length = u.vpkgs.length;
    }
    u.vpkgs.forEach((v, g) => {
      const total = (r.energy[g] ??= new RunningTotal());
      const added = total.feed(v.energyUj);
      // No power from the UPDATE before the first interval (t_ns 0).
      r.watts[g] = powerW !== undefined && u.tNs !== 0n ? (powerW[g] ?? null) : wattsOver(added, dtNs);
    });
    for (const d of domains) {
      const totals = getOr(r.domainEnergy, d.domain, () => []);
      const n = Math.min(d.energyUj.length, u.vpkgs.length);
      totals.length = Math.min(totals.length, n);
      const watts: (number | null)[] = [];
      for (let g = 0; g < n; g++) {
        (totals[g] ??= new RunningTotal()).feed(d.energyUj[g]!);
        watts.push(u.tNs !== 0n ? (d.powerW[g] ?? null) : null);
      }
      r.domainWatts.set(d.domain, watts);
    }
    if (guest !== undefined) {
      r.guest ??= { guest: new RunningTotal(), exact: new RunningTotal(), garbage: new RunningTotal(), garbageWindows: new RunningTotal() };
      r.guest.guest.feed(guest.guestUj);
      r.guest.exact.feed(guest.exactUj);
      r.guest.garbage.feed(guest.garbageUj ?? 0n);
      r.guest.garbageWindows.feed(guest.garbageWindows ?? 0n);
    }
    if (limit !== undefined) this.limitUpdate(r, limit);
    if (u.tNs !== 0n) r.lastTNs = u.tNs;
    if (u.ended) this.end(r);
  }

  /** A VM's limits: only once one was set; a domain's limit that went stays, at 0. */
  private limitUpdate(r: BookedVm, limit: VmLimitValues): void {
    const set = [...limit.limitsMw].filter(([, mw]) => mw > 0n);
    if (r.limit === null && set.length === 0) return;
    r.limit ??= { watts: new Map(), limitedMs: new RunningTotal() };
    for (const d of r.limit.watts.keys()) r.limit.watts.set(d, 0);
    for (const [d, mw] of set) r.limit.watts.set(d, Number(mw) / 1000);
    r.limit.limitedMs.feed(limit.limitedMs);
  }

  /** `domains`: the other RAPL domains' totals per package of the same sample (statistics files only). */
  hostUpdate(h: HostUpdate, domains: readonly HostDomainValues[] = []): void {
    for (const p of h.packages) {
      totalOf(this.packages, p.pkg).feed(p.energyUj);
      if (p.unattributedUj !== null) totalOf(this.packageUnattributed, p.pkg).feed(p.unattributedUj);
    }
    this.unattributed.feed(h.unattributedUj);
    const unattributedSums = new Map<OtherDomain, bigint>();
    for (const d of domains) {
      const byPkg = (m: Map<OtherDomain, Map<number, RunningTotal>>) => getOr(m, d.domain, () => new Map());
      totalOf(byPkg(this.domainPackages), d.pkg).feed(d.energyUj);
      totalOf(byPkg(this.domainPackageUnattributed), d.pkg).feed(d.unattributedUj);
      unattributedSums.set(d.domain, (unattributedSums.get(d.domain) ?? 0n) + d.unattributedUj);
    }
    // Over the packages, as the package's host-wide unattributed energy is (a sum of cumulative values is cumulative).
    for (const [domain, uj] of unattributedSums) totalOf(this.domainUnattributed, domain).feed(uj);
    const s = h.stats;
    const health = this.health;
    health.legacy.ok.feed(s.legacyOk);
    health.legacy.refused.feed(s.legacyRefused);
    health.legacy.failed.feed(s.legacyFailed);
    health.samples.feed(s.samples);
    health.sampleFailures.feed(s.sampleFailures);
    health.daemonConnections = s.connections;
    health.daemonVms = s.vms;
    if (h.tNs !== 0n) {
      health.lastSampleDurationS = Number(s.lastSampleDurationNs) / 1e9;
      health.lastSampleTNs = h.tNs;
    }
    this.hasHost = true;
    this.forgetStale();
  }

  /** VMs a scrape exposes now: running ones and ended ones not yet scraped. */
  exposed(): BookedVm[] {
    return [...this.vms.values()];
  }

  /** Seconds since the daemon's last sample (grows while it is away or stalled), or null before one. */
  lastSampleAgeS(): number | null {
    const t = this.health.lastSampleTNs;
    return t === null ? null : Math.max(0, Number(this.monotonicNs() - t) / 1e9);
  }

  /** Runs one scrape: ended VMs visible at its start are exposed by it, then forgotten (by the last of concurrent scrapes to end). */
  async scrape<T>(render: () => Promise<T>): Promise<T> {
    await this.beforeScrape?.().catch(() => {});
    const ended = [...this.vms.values()].filter((r) => r.endedAtMs !== null);
    try {
      return await render();
    } finally {
      for (const r of ended) r.seenEnded = true;
      this.forgetStale();
    }
  }

  get size(): number {
    return this.vms.size;
  }

  private end(r: BookedVm): void {
    if (r.endedAtMs === null) r.endedAtMs = this.nowMs();
    noWatts(r);
    if (r.hostVmId !== null && this.byHostId.get(r.hostVmId) === r) this.byHostId.delete(r.hostVmId);
    r.hostVmId = null;
  }

  private forgetStale(): void {
    const now = this.nowMs();
    const expired = (r: BookedVm) => now - r.endedAtMs! >= this.limits.endedRetentionMs;
    for (const [k, r] of this.vms) {
      if (r.endedAtMs === null || !(r.seenEnded || expired(r))) continue;
      this.vms.delete(k);
      if (!expired(r)) this.resting.set(k, r);
    }
    for (const [k, r] of this.resting) if (expired(r)) this.resting.delete(k);
    // Oldest first (insertion order): the bound holds whatever the churn.
    for (const k of this.resting.keys()) {
      if (this.resting.size <= this.limits.maxExportedVms) break;
      this.resting.delete(k);
    }
  }

  /** The resting record of this series when it is the same process (same starttime), back in the book. */
  private revive(key: string, starttime: bigint): BookedVm | undefined {
    const r = this.resting.get(key);
    if (!r) return undefined;
    this.resting.delete(key);
    if (r.starttime !== starttime || this.nowMs() - r.endedAtMs! >= this.limits.endedRetentionMs) return undefined;
    this.vms.set(key, r);
    return r;
  }
}
