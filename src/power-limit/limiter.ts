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

/** The most limits one helper holds (a bound on what clients can make it keep). */
const MAX_POWER_LIMITS = STATE_LIMITS.maxPowerLimits;
/** The highest limit a client may set, in watts (u32 milliwatts on the wire). */
const MAX_LIMIT_W = 4_000_000;

/** One VM's limit as `stats`, `watch`, the statistics file and LIMIT's reply show it. */
export interface PowerLimitView {
  limitW: number;
  /** µs per period of CPU bandwidth the helper's quota gives the VM now; null while it sets none. */
  quotaUs: number | null;
  periodUs: number;
  /** Seconds during which the helper's quota was in force. */
  limitedS: number;
  /** Why the limit cannot be applied (the last failure), when it cannot. */
  problem?: string;
}

interface Entry {
  pid: number;
  limitW: number;
  bw: VmBandwidth | null;
  quotaCpus: number | null;
  inForce: { quotaUs: number; periodUs: number } | null;
  limitedS: number;
  lastTicks: number | null;
  fromFile: boolean;
  problem?: string;
}

interface PowerLimiterOptions {
  open: BandwidthOpener;
  log: Logger;
  /** CLK_TCK: ticks per second of CPU time. */
  clkTck: number;
  /** A VM's totals (the engine's: its vCPU tids and ticks), false when it is not known. */
  totalsInto(vmId: number, into: VmTotals): boolean;
}

export class PowerLimiter {
  private readonly vms = new Map<number, Entry>();
  private readonly totals = emptyVmTotals();

  constructor(private readonly o: PowerLimiterOptions) {}

  /** Sets (watts) or removes (null) the limit of a VM; a string says why it was refused. `fromFile`: the limits file sets it. */
  set(vmId: number, pid: number, watts: number | null, fromFile = false): string | null {
    const e = this.vms.get(vmId);
    if (watts === null) {
      if (e) this.drop(vmId, e, 'removed');
      return null;
    }
    if (!(watts > 0 && watts <= MAX_LIMIT_W)) return `a limit is more than 0 and at most ${MAX_LIMIT_W} W`;
    if (e) {
      e.limitW = watts;
      e.fromFile = fromFile;
      delete e.problem;
      return null;
    }
    if (this.vms.size >= MAX_POWER_LIMITS) return `the helper holds ${MAX_POWER_LIMITS} limits, its most`;
    // The totals are the last sample's: the next sample's usage is measured over exactly its interval.
    const lastTicks = this.o.totalsInto(vmId, this.totals) ? this.totals.vcpus.reduce((s, v) => s + v.ticks, 0) : null;
    this.vms.set(vmId, { pid, limitW: watts, bw: null, quotaCpus: null, inForce: null, limitedS: 0, lastTicks, fromFile });
    this.o.log.info({ vm: { id: vmId, pid }, limitW: watts }, `power limit of VM ${vmId} set to ${watts} W`);
    return null;
  }

  view(vmId: number): PowerLimitView | undefined {
    const e = this.vms.get(vmId);
    if (!e) return undefined;
    return {
      limitW: e.limitW,
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

  /** The VMs with a limit; `fromFile`: only those the limits file set. */
  limited(fromFile?: boolean): number[] {
    return [...this.vms].filter(([, e]) => fromFile === undefined || e.fromFile === fromFile).map(([id]) => id);
  }

  /** Every limit and the quota files it holds, for the checkpoint and a restart (restore() takes them up). */
  state(): PowerLimitState[] {
    return [...this.vms].map(([vmId, e]) => ({
      vmId,
      pid: e.pid,
      limitW: e.limitW,
      limitedS: e.limitedS,
      quotaCpus: e.quotaCpus,
      fromFile: e.fromFile,
      groups: e.bw?.state() ?? [],
    }));
  }

  /**
   * The limits a previous process held (a restart, or a crash's checkpoint), for the VMs this one knows
   * again: each goes on from the quota files that process held, their bytes before it kept. A VM not
   * known again is left (its threads are gone, or its registration was refused).
   */
  restore(saved: readonly PowerLimitState[]): void {
    for (const s of saved) {
      if (this.vms.size >= MAX_POWER_LIMITS || !this.o.totalsInto(s.vmId, this.totals)) continue;
      const tids = this.totals.vcpus.map((v) => v.tid);
      const e: Entry = {
        pid: s.pid,
        limitW: s.limitW,
        bw: null,
        quotaCpus: null,
        inForce: null,
        limitedS: s.limitedS,
        lastTicks: null,
        fromFile: s.fromFile,
      };
      e.lastTicks = this.totals.vcpus.reduce((sum, v) => sum + v.ticks, 0);
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
    if (saved.length > 0) this.o.log.info({ limits: this.vms.size }, `power limits taken up: ${this.vms.size} of ${saved.length}`);
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
      const powerW = vm.vpkgEnergyJ.reduce((s, j) => s + j, 0) / result.dtS;
      this.step(vm.vmId, e, { powerW, usedCpus, tids: this.totals.vcpus.map((v) => v.tid) });
    }
  }

  private step(vmId: number, e: Entry, m: { powerW: number; usedCpus: number; tids: number[] }): void {
    const next = nextQuota({ limitW: e.limitW, powerW: m.powerW, usedCpus: m.usedCpus, nvcpu: m.tids.length, quotaCpus: e.quotaCpus });
    try {
      if (next === null) {
        if (e.bw !== null) this.letGo(vmId, e, `power ${m.powerW.toFixed(1)} W stays under the limit of ${e.limitW} W`);
        return;
      }
      if (e.bw === null) {
        if (e.problem !== undefined) return;
        e.bw = this.o.open(e.pid, m.tids);
        const groups = e.bw.groups;
        this.o.log.info(
          { vm: { id: vmId, pid: e.pid }, limitW: e.limitW, powerW: round(m.powerW), groups },
          `power limit of VM ${vmId} starts biting: ${m.powerW.toFixed(1)} W over ${e.limitW} W`,
        );
      }
      e.quotaCpus = next;
      e.inForce = e.bw.set(next);
      this.o.log.debug(
        { vm: { id: vmId }, powerW: round(m.powerW), usedCpus: round(m.usedCpus), quotaCpus: round(next) },
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
      this.o.log.info({ vm: { id: vmId, pid: e.pid }, limitW: e.limitW }, `power limit of VM ${vmId} stops biting: ${why}`);
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
