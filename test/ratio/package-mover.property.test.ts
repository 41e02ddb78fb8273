/**
 * The attack of docs/security.md, "Theft on multi-package hosts by moving in step with sampling", on
 * the engine alone: an attacker VM whose threads spin on package 0 and sit on package 1 at every
 * sample, beside a victim VM that runs on package 1. Each scenario is run twice over the same package
 * energies (the physics does not depend on where the attacker is seen): once with the attacker seen
 * where it ran (honest), once seen on the victim's package (the attack). docs/ratio.md, "Ticks
 * claimed beyond a package's capacity", states what must hold and why.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { RatioEngine } from '../../src/ratio/attribution.js';
import type { IntervalResult } from '../../src/ratio/outputs.js';
import { host, sample, units, type ThreadAt } from './helpers.js';

const CLK_TCK = 100;
const VICTIM = 1000;
const ATTACKER = 2000;

interface Scenario {
  /** CPUs of each package (package 0 is where the attacker runs, package 1 the victim's). */
  cpusPerPackage: number[];
  /** Per interval: ticks each victim vCPU and each attacker thread ran, and what the packages drew. */
  steps: { victim: number[]; attacker: number[]; energyJ: number[] }[];
  victimThreads: number;
  attackerThreads: number;
}

interface Outcome {
  victimJ: number;
  attackerJ: number;
  /** Energy of the host that no VM got, summed over the intervals. */
  unattributedJ: number;
  results: IntervalResult[];
}

/** First CPU of package p. */
function firstCpu(cpusPerPackage: number[], p: number): number {
  return cpusPerPackage.slice(0, p).reduce((a, b) => a + b, 0);
}

/** Runs the scenario with the attacker's threads seen on `attackerPkg` at every sample. */
function run(s: Scenario, attackerPkg: number): Outcome {
  const engine = new RatioEngine(host(s.cpusPerPackage));
  const victimVcpus = Array.from({ length: s.victimThreads }, (_, i) => ({ tid: VICTIM + 1 + i, vpkg: 0 }));
  const attackerVcpus = Array.from({ length: s.attackerThreads }, (_, i) => ({ tid: ATTACKER + 1 + i, vpkg: 0 }));
  const victimId = engine.register({ pid: VICTIM, starttime: 1000, vcpus: victimVcpus });
  const attackerId = engine.register({ pid: ATTACKER, starttime: 1000, vcpus: attackerVcpus });
  const victimCpu = firstCpu(s.cpusPerPackage, 1);
  const seenCpu = firstCpu(s.cpusPerPackage, attackerPkg);
  const vTicks = victimVcpus.map(() => 0);
  const aTicks = attackerVcpus.map(() => 0);
  const energy = s.cpusPerPackage.map(() => 0n);
  const results: IntervalResult[] = [];
  let unattributedJ = 0;
  const take = (t: number) => {
    const tasks: Record<number, ThreadAt[]> = {
      [VICTIM]: [
        { tid: VICTIM, ticks: 0, cpu: victimCpu },
        ...victimVcpus.map((v, i) => ({ tid: v.tid, ticks: vTicks[i]!, cpu: victimCpu })),
      ],
      [ATTACKER]: [
        { tid: ATTACKER, ticks: 0, cpu: seenCpu },
        ...attackerVcpus.map((v, i) => ({ tid: v.tid, ticks: aTicks[i]!, cpu: seenCpu })),
      ],
    };
    return sample(t, Object.fromEntries(energy.map((e, p) => [p, e % 2n ** 32n])), tasks);
  };
  engine.addSample(take(1));
  s.steps.forEach((st, i) => {
    st.victim.forEach((d, k) => (vTicks[k]! += d));
    st.attacker.forEach((d, k) => (aTicks[k]! += d));
    st.energyJ.forEach((j, p) => (energy[p]! += units(j)));
    const r = engine.addSample(take(2 + i))!;
    results.push(r);
    for (const p of r.packages) unattributedJ += p.energyJ - p.attributedJ;
  });
  const total = (id: number) => engine.output(id)!.vpkgs.reduce((a, v) => a + v.energyJ, 0);
  return { victimJ: total(victimId), attackerJ: total(attackerId), unattributedJ, results };
}

/**
 * Random hosts and loads, 1 s intervals, package energy from a power model: idle watts per package
 * plus watts per busy CPU for each workload (the attacker's spin may draw less or more than the
 * victim's work). `hungryAttacker` makes the attacker's spin draw at least what the victim's work
 * draws per CPU, the case where the attacker's own package always has the energy to cover its claim.
 */
function scenario(hungryAttacker: boolean): fc.Arbitrary<Scenario> {
  return fc
    .record({
      cpus: fc.array(fc.integer({ min: 1, max: 3 }), { minLength: 2, maxLength: 3 }),
      victimThreads: fc.integer({ min: 1, max: 3 }),
      attackerThreads: fc.integer({ min: 1, max: 3 }),
      idleW: fc.double({ min: 0, max: 40, noNaN: true }),
      victimW: fc.double({ min: 1, max: 30, noNaN: true }),
      attackerW: fc.double({ min: 0.1, max: 30, noNaN: true }),
      nsteps: fc.integer({ min: 1, max: 6 }),
    })
    .chain((g) => {
      // A hungry attacker on a host of equal packages: its spin on package 0 always draws what its claim on package 1 is worth.
      const cpusPerPackage = hungryAttacker ? g.cpus.map(() => g.cpus[0]!) : g.cpus;
      // Each thread runs at most one CPU's worth; a package's threads at most its CPUs' worth.
      const ticks = (threads: number, cpus: number) =>
        fc.array(fc.integer({ min: 0, max: Math.floor((CLK_TCK * Math.min(threads, cpus)) / threads) }), {
          minLength: threads,
          maxLength: threads,
        });
      const step = fc.record({
        victim: ticks(g.victimThreads, cpusPerPackage[1]!),
        attacker: ticks(g.attackerThreads, cpusPerPackage[0]!),
      });
      const attackerW = hungryAttacker ? g.victimW + g.attackerW : g.attackerW;
      return fc.record({
        cpusPerPackage: fc.constant(cpusPerPackage),
        victimThreads: fc.constant(g.victimThreads),
        attackerThreads: fc.constant(g.attackerThreads),
        steps: fc.array(step, { minLength: g.nsteps, maxLength: g.nsteps }).map((steps) =>
          steps.map((st) => {
            const busy = (t: number[]) => t.reduce((a, b) => a + b, 0) / CLK_TCK; // CPU-seconds in the 1 s interval
            const energyJ = cpusPerPackage.map(() => g.idleW);
            energyJ[0]! += attackerW * busy(st.attacker);
            energyJ[1]! += g.victimW * busy(st.victim);
            return { ...st, energyJ };
          }),
        ),
      });
    });
}

describe('a VM that moves between packages in step with sampling', () => {
  it('takes nothing from the victim when its spin draws more power than the victim’s work', () => {
    fc.assert(
      fc.property(scenario(true), (s) => {
        const honest = run(s, 0);
        const attack = run(s, 1);
        // The victim gets exactly what it gets when the attacker is seen where it ran.
        expect(attack.victimJ).toBeCloseTo(honest.victimJ, 9);
        // The attacker gets no more than what a thread that honestly ran its ticks on package 1 gets
        // (its ticks at package 1's price), and what it gains over being seen where it ran is energy
        // no VM got in the honest run: it comes out of no VM.
        const priced = attack.results.reduce((a, r, i) => {
          const ticks = s.steps[i]!.attacker.reduce((x, y) => x + y, 0);
          const pkg1 = r.packages.find((p) => p.pkg === 1)!;
          return a + (pkg1.energyJ * ticks) / (CLK_TCK * r.dtS * s.cpusPerPackage[1]!);
        }, 0);
        expect(attack.attackerJ).toBeLessThanOrEqual(priced * (1 + 1e-9) + 1e-9);
        expect(attack.attackerJ - honest.attackerJ).toBeLessThanOrEqual(honest.unattributedJ * (1 + 1e-9) + 1e-9);
      }),
      { numRuns: 300 },
    );
  });

  it('costs the victim at most its part of what the other packages could not cover, never more than the plain clamp did, and gains the attacker nothing where it ran on the dearer package', () => {
    fc.assert(
      fc.property(scenario(false), (s) => {
        const honest = run(s, 0);
        const attack = run(s, 1);
        let maxLossJ = 0;
        let clampLossJ = 0;
        attack.results.forEach((r, i) => {
          const st = s.steps[i]!;
          const cap1 = CLK_TCK * r.dtS * s.cpusPerPackage[1]!;
          const v = st.victim.reduce((a, b) => a + b, 0);
          const claimed = v + st.attacker.reduce((a, b) => a + b, 0);
          const e1 = r.packages.find((p) => p.pkg === 1)!.energyJ;
          if (claimed <= cap1) return;
          // Every claim on package 1 at its price, and what the other packages had left (no VM is seen there).
          const excessJ = ((claimed - cap1) * e1) / cap1;
          const leftoverJ = r.packages.filter((p) => p.pkg !== 1).reduce((a, p) => a + p.energyJ, 0);
          maxLossJ += (Math.max(0, excessJ - leftoverJ) * v) / claimed;
          clampLossJ += (e1 * v) / cap1 - (e1 * v) / claimed;
        });
        // Where the package it ran on is at least as dear per tick as the one it is seen on, moving gains the attacker nothing.
        const dearerWhereRan = attack.results.every((r) => {
          const price = (p: number) => r.packages.find((x) => x.pkg === p)!.energyJ / s.cpusPerPackage[p]!;
          return price(0) >= price(1);
        });
        if (dearerWhereRan) expect(attack.attackerJ).toBeLessThanOrEqual(honest.attackerJ * (1 + 1e-9) + 1e-9);
        const lossJ = honest.victimJ - attack.victimJ;
        expect(lossJ).toBeLessThanOrEqual(maxLossJ * (1 + 1e-9) + 1e-9);
        expect(lossJ).toBeLessThanOrEqual(clampLossJ * (1 + 1e-9) + 1e-9);
        expect(attack.victimJ).toBeLessThanOrEqual(honest.victimJ * (1 + 1e-9) + 1e-9);
      }),
      { numRuns: 300 },
    );
  });

  it('leaves the victim its 49.8 W where the plain clamp gave it 28.7 W, on the attack as it was seen', () => {
    // Two packages of one CPU; 10 W idle each and 39.8 W for a busy CPU. The victim keeps package 1's
    // CPU busy (49.8 W there); the attacker spins 73.5 % of package 0's CPU and is seen on package 1.
    const s: Scenario = {
      cpusPerPackage: [1, 1],
      victimThreads: 1,
      attackerThreads: 1,
      // Ticks are whole numbers: 73 and 74 in turn make 73.5 a second.
      steps: Array.from({ length: 10 }, (_, i) => ({
        victim: [100],
        attacker: [i % 2 === 0 ? 73 : 74],
        energyJ: [10 + 39.8 * 0.735, 49.8],
      })),
    };
    const attack = run(s, 1);
    const honest = run(s, 0);
    const seconds = s.steps.length;
    const plainClampW = (49.8 * 100) / (100 + 73.5);
    expect(plainClampW).toBeCloseTo(28.7, 1);
    // Within the counter's unit (2^-14 J) per interval.
    expect(attack.victimJ / seconds).toBeCloseTo(49.8, 3);
    expect(honest.victimJ / seconds).toBeCloseTo(49.8, 3);
    // The attacker gets its ticks at package 1's price (what honest running there gives), paid out of
    // package 0's energy that it left unclaimed, not out of the victim's.
    expect(attack.attackerJ / seconds).toBeCloseTo((49.8 * 73.5) / 100, 3);
    for (const r of attack.results) {
      const [p0, p1] = r.packages;
      expect(p1!.attributedJ).toBeCloseTo(p1!.energyJ, 9);
      expect(p0!.attributedJ).toBeLessThanOrEqual(p0!.energyJ);
    }
  });
});
