/**
 * Exact mode against a simulated QEMU: QEMU's loop (the model) is run on the values the guest
 * counters answered, over random windows of ticks, thread exits, reused tids and packages; what it
 * credits is checked against the energy the helper attributed.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { closeWindow, counterStep, freshGuestCounter, type GuestVm, type ThreadRead } from '../../src/guest-energy/guest-counter.js';
import { copyLoopState, freshLoopState, qemuEnergyDelta, runIteration, type LoopThread } from '../../src/guest-energy/qemu-vmsr-loop.js';

const UNIT_J = 2 ** -14;
const PID = 100;

interface ThreadSpec {
  tid: number;
  starttime: number;
  ticks: number;
  pkg: number;
}

const windowArb = (nthreads: number, npkg: number) =>
  fc.record({
    dticks: fc.array(fc.nat({ max: 120 }), { minLength: nthreads, maxLength: nthreads }),
    pkgs: fc.array(fc.nat({ max: npkg - 1 }), { minLength: nthreads, maxLength: nthreads }),
    // Which non-vCPU thread exits during the window (-1: none), or has its tid reused.
    exit: fc.integer({ min: -1, max: nthreads - 1 }),
    reuse: fc.boolean(),
    energyJ: fc.double({ min: 0, max: 40, noNaN: true }),
    sleepMs: fc.integer({ min: 1000, max: 1600 }),
  });

const scenarioArb = fc
  .record({ nvcpu: fc.integer({ min: 1, max: 3 }), nother: fc.integer({ min: 1, max: 3 }), npkg: fc.integer({ min: 1, max: 2 }) })
  .chain((c) =>
    fc.record({ c: fc.constant(c), windows: fc.array(windowArb(c.nvcpu + c.nother, c.npkg), { minLength: 1, maxLength: 25 }) }),
  );

describe('guest counters in exact mode, against QEMU run on their answers', () => {
  it('QEMU credits what the counters say, which is the attributed energy minus what is carried; no counter goes back', () => {
    fc.assert(
      fc.property(scenarioArb, ({ c, windows }) => {
        const vcpus = new Map<number, number>();
        for (let i = 0; i < c.nvcpu; i++) vcpus.set(PID + 1 + i, i % 2);
        const vm: GuestVm = { pid: PID, vcpus, nvpkg: 2 };
        const maxTicks = new Map([
          [0, 200],
          [1, 200],
        ]);
        let threads: ThreadSpec[] = [];
        for (let i = 0; i < c.nvcpu + c.nother; i++) threads.push({ tid: PID + 1 + i, starttime: 1, ticks: 10, pkg: 0 });
        const s = freshGuestCounter(1, PID, 1, 2, 0);
        const qemu = freshLoopState(2);
        let now = 1_000_000_000n;
        let attributed = 0;
        let nextTid = 1000;
        const lastAnswer = new Map<number, number>();
        const answer = (pkg: number, v: number) => {
          expect(v, 'a counter never goes back').toBeGreaterThanOrEqual(lastAnswer.get(pkg) ?? 0);
          lastAnswer.set(pkg, v);
          return BigInt(v);
        };
        for (const w of windows) {
          const snap = (ts: readonly ThreadSpec[]) => new Map<number, ThreadRead>(ts.map((t) => [t.tid, { ...t }]));
          const start = snap(threads);
          const pkgs = [...new Set(threads.map((t) => t.pkg))].sort((a, b) => a - b);
          const eStart = new Map<number, bigint>();
          for (const p of pkgs) {
            const st = counterStep(s, p, now);
            expect(st.kind).toBe('start');
            if (st.kind !== 'start') return;
            if (st.first) s.start = start;
            eStart.set(p, answer(p, st.value));
          }
          // The window: ticks, an exit or a reused tid (never a vCPU), a new thread, energy attributed.
          const ended = threads.map((t, i) => ({ ...t, ticks: t.ticks + w.dticks[i % w.dticks.length]!, pkg: w.pkgs[i % w.pkgs.length]! }));
          const gone = w.exit >= c.nvcpu ? ended[w.exit]!.tid : -1;
          const after = ended.filter((t) => t.tid !== gone);
          if (gone >= 0 && w.reuse) after.push({ tid: gone, starttime: 99, ticks: 3, pkg: 0 });
          after.push({ tid: nextTid++, starttime: 5, ticks: 1, pkg: 0 });
          attributed += w.energyJ;
          now += BigInt(w.sleepMs) * 1_000_000n;
          const end = snap(after);
          const before = s.creditedUnits;
          const eEnd = new Map<number, bigint>();
          pkgs.forEach((p, i) => {
            const st = counterStep(s, p, now);
            expect(st.kind).toBe('end');
            const v =
              i === 0
                ? closeWindow(s, vm, { pkg: p, end, exactJ: attributed, unitJ: UNIT_J, maxTicks })
                : st.kind === 'end' && !st.first
                  ? st.value
                  : NaN;
            eEnd.set(p, answer(p, v));
          });
          // QEMU, on what it was answered and what it reads of its threads.
          const seen: LoopThread[] = [...start.values()].map((a) => {
            const b = end.get(a.tid);
            const vpkg = vcpus.get(a.tid);
            return { tid: a.tid, pkg: a.pkg, ticks0: a.ticks, ticks1: b ? b.ticks : null, ...(vpkg !== undefined ? { vpkg } : {}) };
          });
          const eDelta = new Map(pkgs.map((p) => [p, qemuEnergyDelta(eStart.get(p)!, eEnd.get(p)!)]));
          const zero = copyLoopState(qemu);
          const alone = runIteration(zero, { threads: seen, eDelta: new Map(pkgs.map((p) => [p, 0n])), maxTicks }).reduce(
            (a, b) => a + b,
            0n,
          );
          const credits = runIteration(qemu, { threads: seen, eDelta, maxTicks });
          const credited = credits.reduce((a, b) => a + b, 0n);
          expect(credited, 'QEMU credits what the model said').toBe(BigInt(s.creditedUnits - before));
          expect(qemu.vpkgCounter).toEqual(s.loop.vpkgCounter);
          // Nothing lost: attributed = credited + carried.
          expect(s.creditedUnits + s.owedUnits).toBeCloseTo(attributed / UNIT_J, 3);
          // What is carried: a window that could not be paid (an exit, no vCPU ticks) carries all,
          // otherwise less than one step of QEMU's rounding.
          const vcpuTicks = seen
            .filter((t) => t.vpkg !== undefined && t.ticks1 !== null)
            .reduce((a, t) => a + Math.max(0, t.ticks1! - t.ticks0), 0);
          const underflow = seen.some((t) => (t.ticks1 === null ? t.ticks0 > 0 : t.ticks1 < t.ticks0)) || (gone >= 0 && w.reuse);
          const slack = seen.length * 2 + seen.reduce((a, t) => a + Math.max(0, (t.ticks1 ?? 0) - t.ticks0), 0) / 200 + 2;
          if (!underflow && vcpuTicks > 0 && pkgs.length === 1) expect(s.owedUnits).toBeLessThan(slack * 2);
          // Below 0 only through QEMU's carried non-vCPU share, which it credits whatever it is given:
          // it then got nothing more.
          if (s.owedUnits < 0) expect(credited).toBe(alone);
          threads = after;
          now += 2_000_000n;
        }
      }),
      { numRuns: 300 },
    );
  });
});
