/**
 * The delta solver's credit (creditOf, worked out without a copy of QEMU's state) against the
 * model's whole iteration (runIteration on a copy), for random states, threads and e_delta values.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { creditOf, MAX_SOLVER_STEPS, solveDelta } from '../../src/guest-energy/delta-solver.js';
import { copyLoopState, runIteration, type LoopState, type LoopThread } from '../../src/guest-energy/qemu-vmsr-loop.js';

const PKG = 1;

const threadArb = (nvpkg: number) =>
  fc.record({
    ticks0: fc.nat({ max: 10_000 }),
    dticks: fc.nat({ max: 300 }),
    gone: fc.boolean(), // its end read failed (QEMU reads 0)
    // A vCPU of a virtual package (past those the model has met too: a socket whose vCPU started
    // late, which QEMU's counters covered all along), or another thread.
    vpkg: fc.option(fc.nat({ max: nvpkg + 2 }), { nil: undefined }),
  });

const problemArb = fc.integer({ min: 1, max: 3 }).chain((nvpkg) =>
  fc.record({
    nvpkg: fc.constant(nvpkg),
    threads: fc.array(threadArb(nvpkg), { maxLength: 12 }),
    eRatio: fc.bigInt({ min: 0n, max: (1n << 64n) - 1n }),
    nbVcpu: fc.nat({ max: 50 }),
    maxTicks: fc.integer({ min: 100, max: 12_800 }),
    e: fc.bigInt({ min: 0n, max: 1n << 40n }),
  }),
);

type Problem = typeof problemArb extends fc.Arbitrary<infer P> ? P : never;

/** The problem's threads as QEMU's loop reads them, the i-th on package `pkgOf(i)`. */
function threadsOf(p: Problem, pkgOf: (i: number) => number): LoopThread[] {
  return p.threads.map((t, i) => ({
    tid: 10 + i,
    pkg: pkgOf(i),
    ticks0: t.ticks0,
    ticks1: t.gone ? null : t.ticks0 + t.dticks,
    ...(t.vpkg !== undefined ? { vpkg: t.vpkg } : {}),
  }));
}

/** QEMU's loop state on PKG, its counters made for `nvpkg` virtual packages. */
function stateOf(p: Problem, nvpkg: number): LoopState {
  return { eRatio: new Map([[PKG, p.eRatio]]), nbVcpu: new Map([[PKG, p.nbVcpu]]), vpkgCounter: new Array<number>(nvpkg).fill(0) };
}

describe('the delta solver', () => {
  it('credits what a whole iteration of the model credits from the package, for any state, threads and e_delta', () => {
    fc.assert(
      fc.property(problemArb, (p) => {
        const threads = threadsOf(p, () => PKG);
        const state = stateOf(p, p.nvpkg);
        const credits = runIteration(copyLoopState(state), {
          threads,
          eDelta: new Map([[PKG, p.e]]),
          maxTicks: new Map([[PKG, p.maxTicks]]),
        });
        const whole = credits.reduce((a, b) => a + b, 0n);
        const pr = { state, pkg: PKG, threads, maxTicks: p.maxTicks, target: 0n };
        expect(creditOf(pr)(p.e)).toBe(whole);
        // And the solver's answer never credits more than a target QEMU's carried share leaves room for.
        if (creditOf(pr)(0n) <= whole) expect(creditOf(pr)(solveDelta({ ...pr, target: whole }) ?? 0n)).toBeLessThanOrEqual(whole);
      }),
      { numRuns: 2000 },
    );
  });

  it('ends within its bound for any layout of threads and virtual packages and any target, with the largest e_delta or none', () => {
    fc.assert(
      fc.property(
        problemArb,
        fc.bigInt({ min: 1n, max: 1n << 72n }),
        fc.integer({ min: 0, max: 3 }),
        fc.nat({ max: 3 }),
        (p, target, metVpkgs, pkg) => {
          // Threads on other packages than the one solved are the caller's to leave out; some here anyway.
          const threads = threadsOf(p, (i) => (i % 3 === 0 ? pkg : PKG));
          // The model may have met fewer virtual packages than the threads' (its counters began before a socket's vCPU).
          const state = stateOf(p, metVpkgs);
          const pr = { state, pkg: PKG, threads: threads.filter((t) => t.pkg === PKG), maxTicks: p.maxTicks, target };
          const started = Date.now();
          const e = solveDelta(pr);
          // MAX_SOLVER_STEPS credits of a dozen threads take well under a second even on a loaded machine.
          expect(Date.now() - started).toBeLessThan(5_000);
          if (e === null) return;
          expect(e).toBeLessThan(1n << 64n);
          if (e > 0n) expect(creditOf(pr)(e)).toBeLessThanOrEqual(target);
          if (e > 0n && e < (1n << 64n) - 1n) expect(creditOf(pr)(e + 1n)).toBeGreaterThan(target);
        },
      ),
      { numRuns: 3000 },
    );
    expect(MAX_SOLVER_STEPS).toBeLessThan(1000);
  });
});
