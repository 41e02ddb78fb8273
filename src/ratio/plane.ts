/** One RAPL domain as the engine attributes it, pure: its counters, energy, pay (overclaim.ts) and each VM's share (docs/ratio.md). */
import { payClaims, type PackagePay } from './overclaim.js';
import { PLATFORM_DOMAINS, type EnergyDomain } from '../model/domains.js';
import type { CounterSpec } from '../model/host.js';

export interface ThreadNow {
  tid: number;
  dticks: number;
  /** Index of the host package it ran on; -1 when the CPU is not in the host map. */
  pk: number;
  /** vpkg when this tid is a registered vCPU. */
  vpkg: number | undefined;
}

/** One counter the engine reads: values mod its range as float64 (exact: a range is at most 2^53), NaN where there is none. */
export interface CounterSlot {
  pkg: number;
  range: bigint;
  unitJ: number;
  now: number;
  /** The value the next interval starts from; NaN after a first sample, a gap, a package value missing. */
  last: number;
}

/** Per slot (a package; a platform domain's one slot holds every CPU and claim) its counter and pay; made once, overwritten after. */
export interface Plane<D extends EnergyDomain = EnergyDomain> {
  domain: D;
  /** Counted once for the host, shared across every package's VMs (psys). */
  platform: boolean;
  /** A value missing from a sample keeps the last one, so the next value spans the gap (every domain but the package). */
  keepsLast: boolean;
  /** Undefined where the package does not have the domain. */
  counters: (CounterSlot | undefined)[];
  /** The interval's energy per slot, J; NaN where either sample lacks the counter. */
  energy: number[];
  /** Per slot how its claims are paid; empty in an interval with no claim. */
  pay: readonly PackagePay[];
  /** Energy given to claims per slot. */
  attributed: number[];
  /** Energy paid to claims beyond their package's capacity out of the other packages' leftover. */
  lent: number;
}

/** The pay of an interval where no thread claimed anything (never written). */
const NO_PAY: readonly PackagePay[] = [];

export function newPlane<D extends EnergyDomain>(domain: D, slots: number): Plane<D> {
  return {
    domain,
    platform: PLATFORM_DOMAINS.has(domain),
    keepsLast: domain !== 'package',
    counters: new Array<CounterSlot | undefined>(slots).fill(undefined),
    energy: new Array<number>(slots).fill(NaN),
    pay: NO_PAY,
    attributed: new Array<number>(slots).fill(0),
    lent: 0,
  };
}

export function counterSlot(pkg: number, c: CounterSpec): CounterSlot {
  return { pkg, range: c.range, unitJ: c.unitJ, now: NaN, last: NaN };
}

/** The plane's energy of the interval per slot: the counter's distance (one wrap at most) times its unit. */
export function closeCounters(p: Plane): void {
  for (let k = 0; k < p.counters.length; k++) {
    const c = p.counters[k];
    if (c === undefined || Number.isNaN(c.now) || Number.isNaN(c.last)) p.energy[k] = NaN;
    else p.energy[k] = (c.now >= c.last ? c.now - c.last : c.now - c.last + Number(c.range)) * c.unitJ;
  }
}

/** How the interval's energy is paid (payClaims), a platform domain as one package; `capacity` null: no thread ran anywhere. */
export function payPlane(p: Plane, packageIds: readonly number[], capacity: readonly number[] | null, claimed: readonly number[]): void {
  p.attributed.fill(0);
  p.lent = 0;
  if (capacity === null) {
    p.pay = NO_PAY;
    return;
  }
  const energyJ = (k: number): number | undefined => (Number.isNaN(p.energy[k]!) ? undefined : p.energy[k]);
  p.pay = payClaims(
    p.platform
      ? [
          {
            pkg: p.counters[0]!.pkg,
            energyJ: energyJ(0),
            capacity: capacity.reduce((sum, c) => sum + c, 0),
            claimed: claimed.reduce((sum, t) => sum + t, 0),
          },
        ]
      : capacity.map((c, k) => ({ pkg: packageIds[k]!, energyJ: energyJ(k), capacity: c, claimed: claimed[k]! })),
  );
}

/** A VM's energy of the domain per vpkg: each thread's e_k (into `es`) and W (non-vCPU threads') spread over its vCPUs. */
export function split(plane: Plane, nvpkg: number, threads: readonly ThreadNow[], es: number[]): { vpkg: number[]; extra: number } {
  let w = 0;
  let nv = 0;
  for (let i = 0; i < threads.length; i++) {
    const t = threads[i]!;
    let e = 0;
    if (t.pk >= 0 && t.dticks !== 0) {
      const k = plane.platform ? 0 : t.pk;
      const de = plane.energy[k]!;
      if (!Number.isNaN(de)) e = (de * t.dticks) / plane.pay[k]!.divisor;
    }
    es[i] = e;
    if (t.vpkg === undefined) w += e;
    else nv++;
  }
  const vpkg = new Array<number>(nvpkg).fill(0);
  if (nv === 0) return { vpkg, extra: 0 };
  const extra = w / nv;
  for (let i = 0; i < threads.length; i++) {
    const t = threads[i]!;
    const e = es[i]!;
    if (t.pk >= 0 && e > 0) {
      const k = plane.platform ? 0 : t.pk;
      const p = plane.pay[k]!;
      plane.attributed[k] = plane.attributed[k]! + (p.borrowedShare === 0 ? e : e * p.ownShare);
      plane.lent += e * p.borrowedShare;
    }
    if (t.vpkg !== undefined) vpkg[t.vpkg] = vpkg[t.vpkg]! + e + extra;
  }
  return { vpkg, extra };
}

/** Adds what each package lent to claims beyond another's capacity to its attributed energy. */
export function settleLent(plane: Plane): void {
  if (plane.lent <= 0) return;
  for (let k = 0; k < plane.pay.length; k++) {
    const p = plane.pay[k]!;
    if (p.lendShare > 0) plane.attributed[k] = plane.attributed[k]! + plane.lent * p.lendShare;
  }
}
