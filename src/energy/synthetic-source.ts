/** On hosts without RAPL (VMs, CI), a clearly labelled synthetic package energy counter driven by /proc/stat load: NOT a measurement. */
import fs from 'node:fs';
import path from 'node:path';
import { cannot } from '../common/errors.js';
import { formatMsrHex, joulesPerCounterUnit, RAPL_COUNTER_RANGE } from '../ratio/counter.js';
import type { DomainCounter, HostCpu } from '../model/host.js';
import { CounterUnwrapper } from './counter-unwrapper.js';
import { EnergyReadError, type EnergyDomain, type EnergyReading, type EnergySource } from './energy-source.js';

interface CpuTimes {
  busy: number;
  total: number;
}

/** Per-CPU busy/total ticks from /proc/stat ("cpuN user nice system idle iowait irq softirq steal ..."). */
export function parseProcStat(text: string): Map<number, CpuTimes> {
  const out = new Map<number, CpuTimes>();
  for (const line of text.split('\n')) {
    const m = /^cpu(\d+)\s+(.*)$/.exec(line);
    if (!m) continue;
    const v = m[2]!.trim().split(/\s+/).map(Number);
    if (v.length < 4 || v.some((x) => !Number.isFinite(x) || x < 0)) continue;
    // guest and guest_nice (fields 9, 10) are already inside user and nice.
    const total = v.slice(0, 8).reduce((a, b) => a + b, 0);
    const idle = (v[3] ?? 0) + (v[4] ?? 0);
    out.set(Number(m[1]), { busy: total - idle, total });
  }
  return out;
}

interface SyntheticEnergyOptions {
  procRoot: string;
  cpus: readonly HostCpu[];
  /** Watts per package when idle. */
  idleW?: number;
  /** Extra watts per package at 100 % busy. */
  busyW?: number;
  /** MSR_RAPL_POWER_UNIT whose ESU (bits 12:8) sets the counter unit. */
  powerUnit?: bigint;
  /** Counter value at start (32 bits). */
  start?: number;
  clock?: () => bigint;
}

/** ESU 14 (61 µJ); a start near the top, so a wrap comes within minutes, as on real hosts. */
export const SYNTHETIC_DEFAULTS = { idleW: 20, busyW: 40, powerUnit: 0xa0e03n, start: 0xffc00000 } as const;

/** Per package `idleW + busyW x busy share of its CPUs`, integrated into a 32-bit counter that wraps like a real one. */
export class SyntheticEnergySource implements EnergySource {
  readonly kind = 'synthetic';
  readonly packages: number[];
  readonly domains: readonly EnergyDomain[] = ['package'];
  readonly domainCounters: readonly DomainCounter[] = [];
  readonly powerUnit: bigint;
  private readonly idleW: number;
  private readonly busyW: number;
  private readonly unitJ: number;
  private readonly cpusOf = new Map<number, number[]>();
  private readonly statPath: string;
  private readonly clock: () => bigint;
  /** Counter per package in units, kept as a float so fractions of a unit are not lost between reads. */
  private readonly perPackage: Map<number, number>;
  private readonly unwrap = new CounterUnwrapper();
  private lastT: bigint;
  private lastTimes: Map<number, CpuTimes>;

  /** Throws an EnergyReadError when /proc/stat cannot be read. */
  constructor(o: SyntheticEnergyOptions) {
    this.idleW = o.idleW ?? SYNTHETIC_DEFAULTS.idleW;
    this.busyW = o.busyW ?? SYNTHETIC_DEFAULTS.busyW;
    if (!(this.idleW >= 0) || !(this.busyW >= 0)) throw new Error('synthetic energy: watts must be >= 0');
    this.powerUnit = o.powerUnit ?? SYNTHETIC_DEFAULTS.powerUnit;
    this.unitJ = joulesPerCounterUnit(this.powerUnit);
    for (const c of o.cpus) this.cpusOf.set(c.pkg, [...(this.cpusOf.get(c.pkg) ?? []), c.cpu]);
    this.packages = [...this.cpusOf.keys()].sort((a, b) => a - b);
    this.statPath = path.join(o.procRoot, 'stat');
    this.clock = o.clock ?? (() => process.hrtime.bigint());
    const start = (o.start ?? SYNTHETIC_DEFAULTS.start) >>> 0;
    this.perPackage = new Map(this.packages.map((p) => [p, start]));
    this.lastT = this.clock();
    this.lastTimes = this.readStat();
  }

  describe(): string {
    return `energy counters SYNTHESISED (no RAPL read): per package ${this.idleW} W idle + ${this.busyW} W x busy share of its CPUs from /proc/stat, power unit ${formatMsrHex(this.powerUnit)}`;
  }

  read(): EnergyReading[] {
    const t = this.clock();
    const times = this.readStat();
    const dt = Number(t - this.lastT) / 1e9;
    const out: EnergyReading[] = [];
    for (const pkg of this.packages) {
      let busy = 0;
      let total = 0;
      for (const cpu of this.cpusOf.get(pkg)!) {
        const a = this.lastTimes.get(cpu);
        const b = times.get(cpu);
        if (!a || !b) continue;
        busy += Math.max(0, b.busy - a.busy);
        total += Math.max(0, b.total - a.total);
      }
      const share = total > 0 ? Math.min(1, busy / total) : 0;
      const joules = dt > 0 ? (this.idleW + this.busyW * share) * dt : 0;
      const units = (this.perPackage.get(pkg)! + joules / this.unitJ) % 2 ** 32;
      this.perPackage.set(pkg, units);
      const counter = { raw: BigInt(Math.floor(units)), range: RAPL_COUNTER_RANGE, unitJ: this.unitJ };
      out.push({ pkg, domain: 'package', energyUj: this.unwrap.energyUj(`package ${pkg}`, counter), counter });
    }
    this.lastT = t;
    this.lastTimes = times;
    return out;
  }

  close(): void {}

  private readStat(): Map<number, CpuTimes> {
    let text: string;
    try {
      text = fs.readFileSync(this.statPath, 'utf8');
    } catch (e) {
      const why = (e as NodeJS.ErrnoException).code ?? String(e);
      const message = cannot(`read ${this.statPath}`, why, 'the synthetic energy source needs the per-CPU times there');
      throw new EnergyReadError(message, this.kind, { cause: e });
    }
    return parseProcStat(text);
  }
}
