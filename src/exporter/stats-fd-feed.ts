/** The book fed from the helper's statistics fds at scrape time (docs/exporter.md "How it follows the daemon"). */
import type { StatsReader, StatsSample } from '../client/stats-reader.js';
import type { EnergyBook } from './energy-book.js';
import type { HostDomainValues } from '../protocol/v2/codec.js';
import { energySourceOfCode } from '../energy/kinds.js';
import type { HostUpdate } from '../client/v2-replies.js';
import { capacityFromFile } from './helper-capacity.js';
import { ENERGY_DOMAINS, isOtherDomain, type EnergyDomain, type OtherDomain } from '../model/domains.js';
import { vmDomainNames } from '../protocol/stats/vm-file.js';
import { hostDomainNames } from '../protocol/stats/host-file.js';

const u64 = (r: StatsReader, s: StatsSample, name: string): bigint => r.value(s, name) ?? 0n;

function hostUpdateFromFile(r: StatsReader, s: StatsSample): HostUpdate {
  const ids = r.values(s, 'package_id') ?? [];
  const energy = r.values(s, 'package_energy') ?? [];
  const unattributed = r.values(s, 'package_unattributed_energy');
  return {
    tNs: u64(r, s, 'sample_monotonic'),
    packages: ids.map((id, i) => ({ pkg: Number(id), energyUj: energy[i] ?? 0n, unattributedUj: unattributed?.[i] ?? null })),
    unattributedUj: u64(r, s, 'unattributed_energy'),
    vmsChanged: false,
    stats: {
      legacyOk: u64(r, s, 'legacy_ok'),
      legacyRefused: u64(r, s, 'legacy_refused'),
      legacyFailed: u64(r, s, 'legacy_failed'),
      lastSampleDurationNs: u64(r, s, 'last_sample_duration'),
      samples: u64(r, s, 'samples'),
      sampleFailures: u64(r, s, 'sample_failures'),
      connections: Number(u64(r, s, 'connections')),
      vms: Number(u64(r, s, 'vms')),
    },
  };
}

/** The other RAPL domains a file has values of (its `<domain>_energy` descriptors), in ENERGY_DOMAINS order. */
function domainsIn(r: StatsReader, energyName: (d: OtherDomain) => string): OtherDomain[] {
  return ENERGY_DOMAINS.filter((d): d is OtherDomain => isOtherDomain(d) && r.descriptor(energyName(d)) !== undefined);
}

/** The host file's other domains: per domain and package it is read on, energy and unattributed energy (µJ, as `package_energy`). */
function hostDomainsFromFile(r: StatsReader, s: StatsSample): HostDomainValues[] {
  const out: HostDomainValues[] = [];
  for (const domain of domainsIn(r, (d) => hostDomainNames(d).energy)) {
    const n = hostDomainNames(domain);
    const ids = r.values(s, n.packageId) ?? [];
    const energy = r.values(s, n.energy) ?? [];
    const unattributed = r.values(s, n.unattributed) ?? [];
    ids.forEach((id, i) => out.push({ domain, pkg: Number(id), energyUj: energy[i] ?? 0n, unattributedUj: unattributed[i] ?? 0n }));
  }
  return out;
}

/** A VM's UPDATE from one sample of its file, its power per virtual package (W), and its other domains' values. */
function vmUpdateFromFile(hostVmId: number, r: StatsReader, s: StatsSample) {
  const energy = r.values(s, 'energy') ?? [];
  const counter = r.values(s, 'msr_energy_status') ?? [];
  const watts = (name: string) => (r.values(s, name) ?? []).map((p) => Number(p) * r.scale(name));
  const domains = domainsIn(r, (d) => vmDomainNames(d).energy).map((domain) => {
    const n = vmDomainNames(domain);
    return { domain, energyUj: r.values(s, n.energy) ?? [], powerW: watts(n.power) };
  });
  const guestUj = r.value(s, 'guest_energy');
  const exactUj = r.value(s, 'guest_exact_energy');
  const garbage = { garbageWindows: r.value(s, 'guest_garbage_windows') ?? 0n, garbageUj: r.value(s, 'guest_garbage_energy') ?? 0n };
  const limitedMs = r.value(s, 'power_limited_time');
  const limitsMw = new Map<EnergyDomain, bigint>([['package', r.value(s, 'power_limit') ?? 0n]]);
  for (const d of domainsIn(r, (x) => vmDomainNames(x).limit)) limitsMw.set(d, r.value(s, vmDomainNames(d).limit) ?? 0n);
  return {
    domains,
    ...(r.descriptor('power_limit') !== undefined && limitedMs !== undefined ? { limit: { limitsMw, limitedMs } } : {}),
    ...(guestUj !== undefined && exactUj !== undefined ? { guest: { guestUj, exactUj, ...garbage } } : {}),
    update: {
      hostVmId,
      tNs: u64(r, s, 'sample_monotonic'),
      vpkgs: energy.map((e, g) => ({ energyUj: e, counter: counter[g] ?? 0n })),
      ended: u64(r, s, 'ended') === 1n || u64(r, s, 'replaced') === 1n,
    },
    powerW: watts('power'),
  };
}

export class StatsFdFeed {
  private readonly vms = new Map<number, StatsReader>();
  /**
   * vm_changes as last read, first when the feed is made (before the first LIST): a VM appearing between that LIST and
   * the first scrape then counts as a change (a baseline taken at that scrape would include it: the VM never listed).
   */
  private lastVmChanges: bigint;

  constructor(
    private readonly book: EnergyBook,
    private readonly host: StatsReader,
  ) {
    this.lastVmChanges = host.value(host.read(), 'vm_changes') ?? 0n;
  }

  /** The VM's file, read from the next scrape on (the feed owns the reader). */
  add(hostVmId: number, r: StatsReader): void {
    this.vms.get(hostVmId)?.close();
    this.vms.set(hostVmId, r);
  }

  /** Reads the host's file into the book; true when VMs changed since the last read (LIST again). */
  readHost(): boolean {
    const s = this.host.read();
    this.book.hostUpdate(hostUpdateFromFile(this.host, s), hostDomainsFromFile(this.host, s));
    // Hostile or newer values map to null: the series is then absent, never a guess.
    this.book.energySource = energySourceOfCode(this.host.value(s, 'energy_source'));
    this.book.capacity = capacityFromFile(this.host, s);
    const changes = this.host.value(s, 'vm_changes') ?? 0n;
    const changed = changes !== this.lastVmChanges;
    this.lastVmChanges = changes;
    return changed;
  }

  /** Reads every VM's file into the book; a VM whose file says it ended is fed once more and let go. */
  readVms(): void {
    for (const [id, r] of this.vms) {
      const { update, powerW, domains, guest, limit } = vmUpdateFromFile(id, r, r.read());
      this.book.vmUpdate(update, powerW, domains, guest, limit);
      if (update.ended) {
        r.close();
        this.vms.delete(id);
      }
    }
  }

  close(): void {
    for (const r of this.vms.values()) r.close();
    this.vms.clear();
    this.host.close();
  }
}
