/**
 * The power limit's feedback rule (src/power-limit/controller.ts) against simulated VMs: a plant whose
 * attributed power grows like the synthetic source's and RAPL's (share of the package x the package's
 * power, which follows the load), over a family of VM sizes, other load, limits and noise.
 */
import { describe, expect, it } from 'vitest';
import { POWER_CONTROL, floorCpus, nextQuota } from '../../src/power-limit/controller.js';

/** A seeded random in [0, 1) (mulberry32): the noise is the same at every run. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

interface Plant {
  nvcpu: number;
  /** CPUs of other load on the 2-CPU-per-vCPU package. */
  other: number;
  /** Relative noise of the measured power (uniform, +-). */
  noise: number;
  /** What the guest would use without a quota. */
  demand: number;
}

/** The attributed power of a VM running `c` CPUs: its share of the package times the package's power (20 W idle + 40 W busy). */
function powerOf(p: Plant, c: number): number {
  const cpus = 2 * p.nvcpu;
  return (c / cpus) * ((20 * cpus) / 2 + (40 * (cpus / 2) * Math.min(cpus, c + p.other)) / cpus);
}

/** Runs the loop for `steps` intervals from unlimited; the powers measured each interval and the quotas set. */
function run(p: Plant, limitW: (step: number) => number, steps: number, seed = 1): { power: number[]; quota: (number | null)[] } {
  const r = rng(seed);
  let quota: number | null = null;
  const power: number[] = [];
  const quotas: (number | null)[] = [];
  for (let i = 0; i < steps; i++) {
    const used = Math.min(quota ?? p.nvcpu, p.demand);
    const w = powerOf(p, used) * (1 + p.noise * (2 * r() - 1));
    power.push(w);
    quota = nextQuota({ limitW: limitW(i), powerW: w, usedCpus: used, nvcpu: p.nvcpu, quotaCpus: quota });
    quotas.push(quota);
  }
  return { power, quota: quotas };
}

const family: Plant[] = [];
for (const nvcpu of [1, 2, 4]) for (const other of [0, 0.5 * nvcpu]) family.push({ nvcpu, other, noise: 0, demand: nvcpu });

describe('power limit controller', () => {
  for (const p of family)
    for (const frac of [0.3, 0.5, 0.8]) {
      it(`settles within 5 intervals and overshoots by at most 10 % (below the limit) when a ${p.nvcpu}-vCPU VM (other load ${p.other}) is limited to ${frac} of its power`, () => {
        const full = powerOf(p, p.nvcpu);
        const limit = full * frac;
        const { power } = run(p, () => limit, 30);
        // power[i] is measured over the interval after step i-1's quota: power[0] is unlimited.
        const settled = power.findIndex((w, i) => power.slice(i).every((x) => Math.abs(x / limit - 1) <= 0.05));
        expect(settled, `powers ${power.map((w) => w.toFixed(1)).join(' ')}`).toBeGreaterThan(0);
        expect(settled).toBeLessThanOrEqual(5);
        // Overshoot: past the limit on the far side (below it, coming down from unlimited).
        expect(Math.min(...power) / limit).toBeGreaterThanOrEqual(0.9);
      });
    }

  it('overshoots a raised limit by at most 10 % and settles within 5 intervals when the limit is raised from a third to two thirds', () => {
    for (const p of family) {
      const full = powerOf(p, p.nvcpu);
      const { power } = run(p, (i) => (i < 15 ? full / 3 : (2 * full) / 3), 40);
      const after = power.slice(16);
      expect(Math.max(...after) / ((2 * full) / 3)).toBeLessThanOrEqual(1.1);
      expect(after.slice(5).every((w) => Math.abs(w / ((2 * full) / 3) - 1) <= 0.05)).toBe(true);
    }
  });

  it('goes below a lowered limit by at most 10 % and settles within 5 intervals when the limit is lowered from 0.6 to a third', () => {
    for (const p of family) {
      const full = powerOf(p, p.nvcpu);
      const { power } = run(p, (i) => (i < 15 ? 0.6 * full : full / 3), 40);
      const after = power.slice(16);
      expect(Math.min(...after) / (full / 3), `powers ${after.map((w) => w.toFixed(1)).join(' ')}`).toBeGreaterThanOrEqual(0.9);
      expect(after.slice(5).every((w) => Math.abs(w / (full / 3) - 1) <= 0.05)).toBe(true);
    }
  });

  it('holds within 5 % on average and does not oscillate when the measured power has 5 % noise', () => {
    for (const p of family)
      for (const seed of [1, 2, 3]) {
        const noisy = { ...p, noise: 0.05 };
        const limit = powerOf(p, p.nvcpu) / 2;
        const { power, quota } = run(noisy, () => limit, 60, seed);
        const tail = power.slice(10);
        const mean = tail.reduce((s, w) => s + w, 0) / tail.length;
        expect(Math.abs(mean / limit - 1)).toBeLessThanOrEqual(0.05);
        // No oscillation: the quota's swings stay of the noise's size, never growing.
        const q = quota.slice(10).map((x) => x ?? p.nvcpu);
        const qMean = q.reduce((s, x) => s + x, 0) / q.length;
        const spread = Math.sqrt(q.reduce((s, x) => s + (x - qMean) ** 2, 0) / q.length) / qMean;
        expect(spread).toBeLessThan(0.06);
        expect(quota.slice(10).every((x) => x !== null)).toBe(true);
      }
  });

  it('never sets a quota below the floor when the limit is below what the floor draws', () => {
    for (const p of family) {
      const { quota, power } = run(p, () => 0.01, 20);
      expect(quota.every((q) => q !== null && q >= floorCpus(p.nvcpu) - 1e-9)).toBe(true);
      expect(quota.at(-1)).toBeCloseTo(POWER_CONTROL.floorPerVcpu * p.nvcpu);
      expect(power.at(-1)).toBeGreaterThan(0.01);
    }
  });

  it('sets nothing when a VM stays under its limit, and lets go once its demand falls under it', () => {
    for (const p of family) {
      expect(run(p, () => powerOf(p, p.nvcpu) * 1.05, 20).quota.every((q) => q === null)).toBe(true);
      // Limited, then the guest goes nearly idle: the quota rises to every CPU and is let go.
      let quota: number | null = null;
      const limit = powerOf(p, p.nvcpu) / 2;
      const seen: (number | null)[] = [];
      for (let i = 0; i < 40; i++) {
        const demand = i < 10 ? p.nvcpu : 0.1 * p.nvcpu;
        const used = Math.min(quota ?? p.nvcpu, demand);
        quota = nextQuota({ limitW: limit, powerW: powerOf(p, used), usedCpus: used, nvcpu: p.nvcpu, quotaCpus: quota });
        seen.push(quota);
      }
      expect(seen[9]).not.toBeNull();
      expect(seen.at(-1)).toBeNull();
    }
  });

  it('keeps its quota when the power is unknown or not positive', () => {
    for (const powerW of [0, NaN, -3, Infinity]) expect(nextQuota({ limitW: 10, powerW, usedCpus: 1, nvcpu: 2, quotaCpus: 0.7 })).toBe(0.7);
  });
});
