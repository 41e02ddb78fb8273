/** Ticks claimed beyond a package's capacity ran elsewhere: paid from others' leftover, then its claimants' (docs/ratio.md). Pure. */

interface PackageClaims {
  pkg: number;
  /** dE_p, joules; undefined when the interval has no energy for the package (nothing is paid there). */
  energyJ: number | undefined;
  /** cap_p = CLK_TCK * dt * n_p, ticks. */
  capacity: number;
  /** D_p: ticks of every registered thread seen on the package at the end of the interval. */
  claimed: number;
}

export interface PackagePay {
  /** e_k = dE_p * dticks_k / divisor: cap_p when every claim is paid in full, D_p when nothing covers the excess, else between. */
  divisor: number;
  /** Share of what this package's claimants get that its own energy pays (1 unless it is over capacity). */
  ownShare: number;
  /** Share of what they get that the lenders pay: 1 - ownShare, computed without cancelling. */
  borrowedShare: number;
  /** Share of all funded excess this package pays out of its leftover (0 unless it lends). */
  lendShare: number;
}

/** Per package (same order) its divisor and who pays; with no leftover anywhere, every divisor is max(cap_p, D_p), exactly. */
export function payClaims(packages: readonly PackageClaims[]): PackagePay[] {
  let leftover = 0;
  let excess = 0;
  for (const p of packages) {
    if (p.energyJ === undefined || p.capacity <= 0) continue;
    if (p.claimed > p.capacity) excess += ((p.claimed - p.capacity) * p.energyJ) / p.capacity;
    else leftover += (p.energyJ * (p.capacity - p.claimed)) / p.capacity;
  }
  // Share of the excess that the other packages' leftover covers.
  const funded = excess > 0 && leftover > 0 ? Math.min(1, leftover / excess) : 0;
  return packages.map((p) => {
    if (p.energyJ === undefined || p.capacity <= 0 || p.claimed <= p.capacity) {
      const lends = funded > 0 && p.energyJ !== undefined && p.capacity > 0 && p.claimed < p.capacity;
      const lendShare = lends ? (p.energyJ! * (p.capacity - p.claimed)) / p.capacity / leftover : 0;
      return { divisor: Math.max(p.capacity, p.claimed), ownShare: 1, borrowedShare: 0, lendShare };
    }
    if (funded === 0) return { divisor: p.claimed, ownShare: 1, borrowedShare: 0, lendShare: 0 };
    if (funded === 1)
      return { divisor: p.capacity, ownShare: p.capacity / p.claimed, borrowedShare: (p.claimed - p.capacity) / p.claimed, lendShare: 0 };
    const paid = p.capacity + funded * (p.claimed - p.capacity);
    return {
      divisor: (p.capacity * p.claimed) / paid,
      ownShare: p.capacity / paid,
      borrowedShare: (funded * (p.claimed - p.capacity)) / paid,
      lendShare: 0,
    };
  });
}
