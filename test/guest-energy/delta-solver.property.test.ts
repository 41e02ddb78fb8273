/**
 * The delta solver's credit (creditedFrom, worked out without a copy of QEMU's state) against the
 * model's whole iteration (runIteration on a copy), for random states, threads and e_delta values.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { creditedFrom, solveDelta } from '../../src/guest-energy/delta-solver.js';
import { copyLoopState, runIteration, type LoopState, type LoopThread } from '../../src/guest-energy/qemu-vmsr-loop.js';

const PKG = 1;

const threadArb = (nvpkg: number) =>
  fc.record({
    ticks0: fc.nat({ max: 10_000 }),
    dticks: fc.nat({ max: 300 }),
    gone: fc.boolean(), // its end read failed (QEMU reads 0)
    // A vCPU of a virtual package (one past the last too: QEMU skips it), or another thread.
    vpkg: fc.option(fc.nat({ max: nvpkg }), { nil: undefined }),
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

describe('the delta solver', () => {
  it('credits what a whole iteration of the model credits from the package, for any state, threads and e_delta', () => {
    fc.assert(
      fc.property(problemArb, (p) => {
        const threads: LoopThread[] = p.threads.map((t, i) => ({
          tid: 10 + i,
          pkg: PKG,
          ticks0: t.ticks0,
          ticks1: t.gone ? null : t.ticks0 + t.dticks,
          ...(t.vpkg !== undefined ? { vpkg: t.vpkg } : {}),
        }));
        const state: LoopState = {
          eRatio: new Map([[PKG, p.eRatio]]),
          nbVcpu: new Map([[PKG, p.nbVcpu]]),
          vpkgCounter: new Array<number>(p.nvpkg).fill(0),
        };
        const credits = runIteration(copyLoopState(state), {
          threads,
          eDelta: new Map([[PKG, p.e]]),
          maxTicks: new Map([[PKG, p.maxTicks]]),
        });
        const whole = credits.reduce((a, b) => a + b, 0n);
        const pr = { state, pkg: PKG, threads, maxTicks: p.maxTicks, target: 0n };
        expect(creditedFrom(pr, p.e)).toBe(whole);
        // And the solver's answer never credits more than a target QEMU's carried share leaves room for.
        if (creditedFrom(pr, 0n) <= whole) expect(creditedFrom(pr, solveDelta({ ...pr, target: whole }))).toBeLessThanOrEqual(whole);
      }),
      { numRuns: 2000 },
    );
  });
});
