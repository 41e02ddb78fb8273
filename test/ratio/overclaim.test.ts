/**
 * Who pays for ticks claimed beyond a package's capacity (docs/ratio.md, step 7), on worked numbers.
 */
import { describe, expect, it } from 'vitest';
import { payClaims } from '../../src/ratio/overclaim.js';

describe('payClaims', () => {
  it('is the plain clamp max(cap, D) on a one-package host', () => {
    const [p] = payClaims([{ pkg: 0, energyJ: 100, capacity: 200, claimed: 400 }]);
    expect(p).toEqual({ divisor: 400, ownShare: 1, borrowedShare: 0, lendShare: 0 });
    expect(payClaims([{ pkg: 0, energyJ: 100, capacity: 200, claimed: 150 }])[0]!.divisor).toBe(200);
  });

  it('pays an excess in full at the claimed package’s price when the other packages’ leftover covers it', () => {
    // Package 1: 150 ticks on 100, 50 J: the excess of 50 ticks is worth 25 J. Package 0: nothing claimed, 40 J left.
    const [p0, p1] = payClaims([
      { pkg: 0, energyJ: 40, capacity: 100, claimed: 0 },
      { pkg: 1, energyJ: 50, capacity: 100, claimed: 150 },
    ]);
    expect(p1!.divisor).toBe(100); // every claim at 50 J / 100 ticks
    expect(p1!.ownShare).toBeCloseTo(100 / 150, 12); // package 1 pays 50 J of the 75 J
    expect(p1!.borrowedShare).toBeCloseTo(50 / 150, 12);
    expect(p0!).toMatchObject({ divisor: 100, ownShare: 1, lendShare: 1 });
  });

  it('pays the part of an excess the leftover covers and scales the rest, never below the plain clamp', () => {
    // Excess 25 J, leftover 10 J (package 0: 20 J, half of its capacity claimed): f = 0.4.
    const [p0, p1] = payClaims([
      { pkg: 0, energyJ: 20, capacity: 100, claimed: 50 },
      { pkg: 1, energyJ: 50, capacity: 100, claimed: 150 },
    ]);
    const paid = 100 + 0.4 * 50;
    expect(p1!.divisor).toBeCloseTo((100 * 150) / paid, 12);
    expect(p1!.divisor).toBeLessThan(150);
    // What package 1's claimants get: 150 ticks * 50 J / divisor = 50 J own + 10 J lent.
    expect((150 * 50) / p1!.divisor).toBeCloseTo(60, 12);
    expect(p1!.ownShare + p1!.borrowedShare).toBeCloseTo(1, 12);
    expect(p0!.lendShare).toBe(1);
  });

  it('lends from each package with leftover in proportion to it, and from none without energy', () => {
    const pay = payClaims([
      { pkg: 0, energyJ: 30, capacity: 100, claimed: 0 }, // 30 J left
      { pkg: 1, energyJ: 100, capacity: 100, claimed: 300 }, // excess 200 J
      { pkg: 2, energyJ: 20, capacity: 100, claimed: 50 }, // 10 J left
      { pkg: 3, energyJ: undefined, capacity: 100, claimed: 0 }, // no counter this interval
    ]);
    expect(pay[0]!.lendShare).toBeCloseTo(0.75, 12);
    expect(pay[2]!.lendShare).toBeCloseTo(0.25, 12);
    expect(pay[3]!.lendShare).toBe(0);
    // 40 J of 200 J: f = 0.2; the claims on package 1 get 100 + 40 J.
    expect((300 * 100) / pay[1]!.divisor).toBeCloseTo(140, 9);
  });
});
