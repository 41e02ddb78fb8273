/**
 * The power limits of the helper's VMs (docs/power-limits.md): the limit table (host VM id -> watts),
 * and each sample's step of the loop (controller.ts) through each limited VM's CPU bandwidth
 * (cpu-bandwidth.ts). A VM under its limit is left alone; a quota the helper set is given back, byte
 * for byte, when the limit is removed, the VM ends or the helper stops (close()).
 */
import type { Logger } from '../logging/logger.js';
import { emptyVmTotals, type IntervalResult, type VmTotals } from '../ratio/outputs.js';
import { nextQuota } from './controller.js';
import type { BandwidthOpener, VmBandwidth } from './cpu-bandwidth.js';
import { STATE_LIMITS, type PowerLimitState } from '../state/snapshot.js';
import { ENERGY_DOMAINS, type EnergyDomain } from '../model/domains.js';

/** The most limits one helper holds (a bound on what clients can make it keep). */
const MAX_POWER_LIMITS = STATE_LIMITS.maxPowerLimits;
/** The highest limit a client may set, in watts (u32 milliwatts on the wire). */
const MAX_LIMIT_W = 4_000_000;

/** One VM's limit as `stats`, `watch`, the statistics file and LIMIT's reply show it. */
export interface PowerLimitView {
  /** The domain whose attributed power is limited. */
  domain: EnergyDomain;
  limitW: number;
  /** µs per period of CPU bandwidth the helper's quota gives the VM now; null while it sets none. */
  quotaUs: number | null;
  periodUs: number;
  /** Seconds during which the helper's quota was in force. */
  limitedS: number;
  /** Why the limit cannot be applied (the last failure), when it cannot. */
  problem?: string;
}

/** One limit of a VM: on one RAPL domain's attributed power. */
interface DomainLimit {
  limitW: number;
  fromFile: boolean;
}

interface Entry {
  pid: number;
  /** At most one limit per domain; the VM's quota is the lowest the limits ask. */
  limits: Map<EnergyDomain, DomainLimit>;
  bw: VmBandwidth | null;
  quotaCpus: number | null;
  inForce: { quotaUs: number; periodUs: number } | null;
  limitedS: number;
  lastTicks: number | null;
  problem?: string;
}

interface PowerLimiterOptions {
  open: BandwidthOpener;
  log: Logger;
  /** CLK_TCK: ticks per second of CPU time. */
  clkTck: number;
  /** A VM's totals (the engine's: its vCPU tids and ticks), false when it is not known. */
  totalsInto(vmId: number, into: VmTotals): boolean;
  /** The domains the engine attributes (the package and the host's others); a limit on another is refused. */
  domains: readonly EnergyDomain[];
}

export class PowerLimiter {
  private readonly vms = new Map<number, Entry>();
  private readonly totals = emptyVmTotals();

  constructor(private readonly o: PowerLimiterOptions) {}

  /** Why a limit on `domain` cannot be set here, or null (a domain the engine does not attribute). */
  domainProblem(domain: EnergyDomain): string | null {
    if (this.o.domains.includes(domain)) return null;
    return `this host's helper does not attribute ${domain} power (it attributes ${this.o.domains.join(', ')}); limit one of those`;
  }

  /** Sets (watts) or removes (null) a VM's limit on a domain; a string says why it was refused. `fromFile`: the limits file sets it. */
  set(vmId: number, pid: number, watts: number | null, fromFile = false, domain: EnergyDomain = 'package'): string | null {
    const e = this.vms.get(vmId);
    if (watts === null) {
      if (e?.limits.delete(domain) && e.limits.size === 0) this.drop(vmId, e, 'removed');
      return null;
    }
    if (!(watts > 0 && watts <= MAX_LIMIT_W)) return `a limit is more than 0 and at most ${MAX_LIMIT_W} W`;
    const problem = this.domainProblem(domain);
    if (problem !== null) return problem;
    if (!e?.limits.has(domain) && this.count() >= MAX_POWER_LIMITS) return `the helper holds ${MAX_POWER_LIMITS} limits, its most`;
    if (e) {
      e.limits.set(domain, { limitW: watts, fromFile });
      delete e.problem;
      return null;
    }
    // The totals are the last sample's: the next sample's usage is measured over exactly its interval.
    const lastTicks = this.o.totalsInto(vmId, this.totals) ? this.totals.vcpus.reduce((s, v) => s + v.ticks, 0) : null;
    const limits = new Map([[domain, { limitW: watts, fromFile }]]);
    this.vms.set(vmId, { pid, limits, bw: null, quotaCpus: null, inForce: null, limitedS: 0, lastTicks });
    this.o.log.info({ vm: { id: vmId, pid }, limitW: watts, domain }, `power limit of VM ${vmId} set to ${watts} W (${domain})`);
    return null;
  }

  private count(): number {
    let n = 0;
    for (const e of this.vms.values()) n += e.limits.size;
    return n;
  }

  /** A VM's limit on a domain, with the VM's quota in force; undefined without one. */
  view(vmId: number, domain: EnergyDomain = 'package'): PowerLimitView | undefined {
    const l = this.vms.get(vmId)?.limits.get(domain);
    return l && this.viewOf(this.vms.get(vmId)!, domain, l.limitW);
  }

  /** Every limit of a VM, in ENERGY_DOMAINS order. */
  views(vmId: number): PowerLimitView[] {
    const e = this.vms.get(vmId);
    if (!e) return [];
    return ENERGY_DOMAINS.flatMap((domain) => {
      const l = e.limits.get(domain);
      return l ? [this.viewOf(e, domain, l.limitW)] : [];
    });
  }

  private viewOf(e: Entry, domain: EnergyDomain, limitW: number): PowerLimitView {
    return {
      domain,
      limitW,
      quotaUs: e.inForce?.quotaUs ?? null,
      periodUs: e.inForce?.periodUs ?? 0,
      limitedS: e.limitedS,
      ...(e.problem !== undefined ? { problem: e.problem } : {}),
    };
  }

  /** The VM is gone from the helper (unregistered, dropped): its limit goes, its quota is given back. */
  forget(vmId: number): void {
    const e = this.vms.get(vmId);
    if (e) this.drop(vmId, e, 'the VM is gone');
  }

  /** The limits, as [VM, domain]; `fromFile`: only those the limits file set. */
  limited(fromFile?: boolean): [number, EnergyDomain][] {
    return [...this.vms].flatMap(([id, e]) =>
      [...e.limits].filter(([, l]) => fromFile === undefined || l.fromFile === fromFile).map(([d]): [number, EnergyDomain] => [id, d]),
    );
  }

  /**
   * Every limit (one record per VM and domain) and the quota files it holds, for the checkpoint and a
   * restart (restore() takes them up): the VM's quota and groups ride on its first record only.
   */
  state(): PowerLimitState[] {
    return [...this.vms].flatMap(([vmId, e]) =>
      [...e.limits].map(([domain, l], i) => ({
        vmId,
        pid: e.pid,
        domain,
        limitW: l.limitW,
        limitedS: e.limitedS,
        quotaCpus: i === 0 ? e.quotaCpus : null,
        fromFile: l.fromFile,
        groups: i === 0 ? (e.bw?.state() ?? []) : [],
      })),
    );
  }

  /**
   * The limits a previous process held (a restart, or a crash's checkpoint), for the VMs this one knows
   * again: each goes on from the quota files that process held, their bytes before it kept. A VM not
   * known again is left (its threads are gone, or its registration was refused).
   */
  restore(saved: readonly PowerLimitState[]): void {
    for (const s of saved) {
      const known = this.vms.get(s.vmId);
      if (known) {
        if (this.count() < MAX_POWER_LIMITS) known.limits.set(s.domain, { limitW: s.limitW, fromFile: s.fromFile });
        continue;
      }
      if (this.count() >= MAX_POWER_LIMITS || !this.o.totalsInto(s.vmId, this.totals)) continue;
      const tids = this.totals.vcpus.map((v) => v.tid);
      const lastTicks = this.totals.vcpus.reduce((sum, v) => sum + v.ticks, 0);
      const limits = new Map([[s.domain, { limitW: s.limitW, fromFile: s.fromFile }]]);
      const e: Entry = { pid: s.pid, limits, bw: null, quotaCpus: null, inForce: null, limitedS: s.limitedS, lastTicks };
      this.vms.set(s.vmId, e);
      if (s.groups.length === 0 || s.quotaCpus === null) continue;
      try {
        e.bw = this.o.open(s.pid, tids, s.groups);
        e.quotaCpus = s.quotaCpus;
        e.inForce = e.bw.set(s.quotaCpus);
      } catch (err) {
        e.problem = (err as Error).message;
        this.o.log.warn(
          { vm: { id: s.vmId, pid: s.pid }, err: e.problem },
          `cannot take up the power limit of VM ${s.vmId} where the last process left it`,
        );
      }
    }
    if (saved.length > 0) this.o.log.info({ limits: this.count() }, `power limits taken up: ${this.count()} of ${saved.length}`);
  }

  /** One step of every limited VM's loop, on the interval the engine just measured. */
  sample(result: IntervalResult | null, ended: readonly number[]): void {
    for (const vmId of ended) {
      const e = this.vms.get(vmId);
      if (e) this.drop(vmId, e, 'the VM ended');
    }
    if (result === null || !(result.dtS > 0)) return;
    for (const vm of result.vms) {
      const e = this.vms.get(vm.vmId);
      if (!e || !this.o.totalsInto(vm.vmId, this.totals)) continue;
      const ticks = this.totals.vcpus.reduce((s, v) => s + v.ticks, 0);
      const usedCpus = e.lastTicks === null ? this.totals.vcpus.length : Math.max(0, ticks - e.lastTicks) / this.o.clkTck / result.dtS;
      e.lastTicks = ticks;
      if (e.inForce !== null) e.limitedS += result.dtS;
      this.step(vm.vmId, e, { powerW: domainPowers(vm, result.dtS), usedCpus, tids: this.totals.vcpus.map((v) => v.tid) });
    }
  }

  /** The quota the VM's limits ask: the lowest any asks (null: every limit lets go), and the domain that sets it. */
  private quotaOf(e: Entry, m: { powerW: Map<EnergyDomain, number>; usedCpus: number; nvcpu: number }) {
    let next: { cpus: number | null; domain: EnergyDomain; powerW: number; limitW: number } | null = null;
    for (const [domain, l] of e.limits) {
      const powerW = m.powerW.get(domain) ?? 0;
      const cpus = nextQuota({ limitW: l.limitW, powerW, usedCpus: m.usedCpus, nvcpu: m.nvcpu, quotaCpus: e.quotaCpus });
      if (next === null || (cpus !== null && (next.cpus === null || cpus < next.cpus))) next = { cpus, domain, powerW, limitW: l.limitW };
    }
    return next!;
  }

  private step(vmId: number, e: Entry, m: { powerW: Map<EnergyDomain, number>; usedCpus: number; tids: number[] }): void {
    const q = this.quotaOf(e, { ...m, nvcpu: m.tids.length });
    const what = `${q.domain} power ${q.powerW.toFixed(1)} W`;
    try {
      if (q.cpus === null) {
        if (e.bw !== null) this.letGo(vmId, e, `${what} stays under the limit of ${q.limitW} W`);
        return;
      }
      if (e.bw === null) {
        if (e.problem !== undefined) return;
        e.bw = this.o.open(e.pid, m.tids);
        const groups = e.bw.groups;
        this.o.log.info(
          { vm: { id: vmId, pid: e.pid }, domain: q.domain, limitW: q.limitW, powerW: round(q.powerW), groups },
          `power limit of VM ${vmId} starts biting: ${what} over ${q.limitW} W`,
        );
      }
      e.quotaCpus = q.cpus;
      e.inForce = e.bw.set(q.cpus);
      this.o.log.debug(
        { vm: { id: vmId }, domain: q.domain, powerW: round(q.powerW), usedCpus: round(m.usedCpus), quotaCpus: round(q.cpus) },
        'power limit step',
      );
    } catch (err) {
      e.problem = (err as Error).message;
      this.o.log.warn({ vm: { id: vmId, pid: e.pid }, err: e.problem }, `cannot apply the power limit of VM ${vmId}`);
      if (e.bw !== null) this.letGo(vmId, e, 'it failed');
    }
  }

  private letGo(vmId: number, e: Entry, why: string): void {
    const bw = e.bw;
    [e.bw, e.quotaCpus, e.inForce] = [null, null, null];
    if (bw === null) return;
    try {
      bw.release();
      this.o.log.info({ vm: { id: vmId, pid: e.pid } }, `power limit of VM ${vmId} stops biting: ${why}`);
    } catch (err) {
      this.o.log.warn({ vm: { id: vmId, pid: e.pid }, err: (err as Error).message }, `cannot give back the CPU quota of VM ${vmId}`);
    }
  }

  private drop(vmId: number, e: Entry, why: string): void {
    this.letGo(vmId, e, why);
    this.vms.delete(vmId);
    this.o.log.info({ vm: { id: vmId, pid: e.pid } }, `power limit of VM ${vmId} ${why === 'removed' ? 'removed' : `dropped: ${why}`}`);
  }

  /** Gives back every quota the helper set (the helper stops); the limits stay, taken up again by the next sample. */
  close(): void {
    for (const [vmId, e] of this.vms) this.letGo(vmId, e, 'the helper stops');
  }
}

const round = (w: number) => Math.round(w * 10) / 10;

/** A VM's attributed power of each domain over the interval, summed over its virtual packages. */
function domainPowers(vm: IntervalResult['vms'][number], dtS: number): Map<EnergyDomain, number> {
  const sum = (j: readonly number[]) => j.reduce((s, x) => s + x, 0) / dtS;
  return new Map<EnergyDomain, number>([
    ['package', sum(vm.vpkgEnergyJ)],
    ...(vm.domains ?? []).map((d): [EnergyDomain, number] => [d.domain, sum(d.vpkgEnergyJ)]),
  ]);
}
