/**
 * Host energy accounting for HOST_UPDATE: per host package since sampling started, its energy and the
 * part of it attributed to no VM, and the time of the last sample. Plain numbers in, plain data out:
 * state() is what a restart would carry, and a HostEnergy made with it goes on from there.
 */
import type { HostValues } from '../../protocol/v2/codec.js';

/** One package's totals since sampling started (J). */
export interface PackageTotals {
  pkg: number;
  energyJ: number;
  unattributedJ: number;
}

export interface HostEnergyState {
  /** Monotonic time of the last sample (0n before the first). */
  tNs: bigint;
  packages: PackageTotals[];
}

/** One package's energy in one interval and the part of it given to VMs (IntervalResult.packages). */
export interface PackageInterval {
  package: number;
  energyJ: number;
  attributedJ: number;
}

/** The daemon-wide counters HOST_UPDATE carries beside the energy. */
export type HostStats = HostValues['stats'];

const uj = (j: number): bigint => BigInt(Math.floor(j * 1e6));

export class HostEnergy {
  private readonly totals = new Map<number, { energyJ: number; unattributedJ: number }>();
  private tNs = 0n;

  /** Every package of the host starts at zero (HOST_UPDATE lists each from the start), or where `from` left off. */
  constructor(packages: readonly number[], from?: HostEnergyState) {
    for (const pkg of packages) this.totals.set(pkg, { energyJ: 0, unattributedJ: 0 });
    if (from === undefined) return;
    this.tNs = from.tNs;
    for (const p of from.packages) this.totals.set(p.pkg, { energyJ: p.energyJ, unattributedJ: p.unattributedJ });
  }

  /** One sample: its time, and its packages' energy (none when it was a baseline). */
  add(tNs: bigint, packages: readonly PackageInterval[]): void {
    this.tNs = tNs;
    for (const p of packages) {
      let k = this.totals.get(p.package);
      if (!k) this.totals.set(p.package, (k = { energyJ: 0, unattributedJ: 0 }));
      k.energyJ += p.energyJ;
      // Never negative in an interval (attributed can pass energy only by float rounding), so the
      // cumulative value never goes back.
      k.unattributedJ += Math.max(0, p.energyJ - p.attributedJ);
    }
  }

  /** HOST_UPDATE's values; per-package unattributed energy only when `perPackage`. */
  values(vmsChanged: boolean, perPackage: boolean, stats: HostStats): HostValues {
    let unattributedJ = 0;
    for (const k of this.totals.values()) unattributedJ += k.unattributedJ;
    return {
      tNs: this.tNs,
      packages: [...this.totals].map(([pkg, k]) => ({
        pkg,
        energyUj: uj(k.energyJ),
        unattributedUj: perPackage ? uj(k.unattributedJ) : null,
      })),
      unattributedUj: uj(unattributedJ),
      vmsChanged,
      stats,
    };
  }

  state(): HostEnergyState {
    return { tNs: this.tNs, packages: [...this.totals].map(([pkg, k]) => ({ pkg, ...k })) };
  }
}
