import { describe, expect, it } from 'vitest';
import {
  freshLoopState,
  lroundU64,
  qemuEnergyDelta,
  ratioUnits,
  runIteration,
  type LoopThread,
} from '../../src/guest-energy/qemu-vmsr-loop.js';

const M = 200; // CLK_TCK 100 x 2 CPUs
const maxTicks = new Map([[0, M]]);
const vcpu = (tid: number, t0: number, t1: number | null, vpkg = 0): LoopThread => ({ tid, pkg: 0, ticks0: t0, ticks1: t1, vpkg });
const other = (tid: number, t0: number, t1: number | null): LoopThread => ({ tid, pkg: 0, ticks0: t0, ticks1: t1 });

describe("the model of QEMU's vmsr loop", () => {
  it('credits a vCPU e_delta x ticks / maxticks, rounded half away from zero, as vmsr_get_ratio and lround do', () => {
    expect(ratioUnits(120_000n, 50n, M)).toBe(30_000n);
    expect(ratioUnits(3n, 1n, M)).toBe(0n); // 0.015
    expect(lroundU64(2.5)).toBe(3n);
    expect(lroundU64(0.49999999999999994)).toBe(0n);
    const s = freshLoopState(1);
    expect(runIteration(s, { threads: [vcpu(11, 1000, 1050)], eDelta: new Map([[0, 120_000n]]), maxTicks })).toEqual([30_000n]);
    expect(s.vpkgCounter).toEqual([30_000]);
  });

  it('gives a wrapped package counter a delta of 0 (e_end > e_start ? ... : 0)', () => {
    expect(qemuEnergyDelta(0xffff_fff0n, 0x10n)).toBe(0n);
    expect(qemuEnergyDelta(5n, 5n)).toBe(0n);
    expect(qemuEnergyDelta(5n, 9n)).toBe(4n);
  });

  it('keeps e_ratio and nb_vcpu from iteration to iteration: the non-vCPU share is divided by a count that only grows', () => {
    const s = freshLoopState(1);
    const w = (k: number) => ({
      threads: [vcpu(11, k * 50, k * 50 + 50), other(12, k * 10, k * 10 + 10)],
      eDelta: new Map([[0, 100_000n]]),
      maxTicks,
    });
    const credits = [0, 1, 2, 3].map((k) => runIteration(s, w(k))[0]);
    // vCPU: 100000 x 50 / 200 = 25000; other: 5000 added to e_ratio, then e_ratio / nb_vcpu (1, 2, 3, 4).
    expect(credits).toEqual([25_000n + 5_000n, 25_000n + 5_000n, 25_000n + 3_333n, 25_000n + 2_083n]);
    expect(s.nbVcpu.get(0)).toBe(4);
    expect(s.eRatio.get(0)).toBe(2_083n);
  });

  it('underflows the tick delta of a thread that exited: with e_delta > 0 the u64 garbage reaches e_ratio; with 0 nothing does', () => {
    const bad = freshLoopState(1);
    const threads = [vcpu(11, 1000, 1050), other(13, 400, null)];
    const credit = runIteration(bad, { threads, eDelta: new Map([[0, 100_000n]]), maxTicks })[0]!;
    expect(bad.eRatio.get(0)).toBe(1n << 63n);
    expect(credit).toBe(25_000n + (1n << 63n));
    // The guest's u32 counter gets the low bits: 25 000 + 2^63 mod 2^32.
    expect(bad.vpkgCounter[0]).toBe(25_000);
    const safe = freshLoopState(1);
    expect(runIteration(safe, { threads, eDelta: new Map([[0, 0n]]), maxTicks })).toEqual([0n]);
    expect(safe.eRatio.get(0)).toBe(0n);
  });

  it('credits only vCPUs whose ticks moved, and wraps the guest counter at 2^32', () => {
    const s = freshLoopState(2);
    s.vpkgCounter[0] = 2 ** 32 - 10;
    const credits = runIteration(s, { threads: [vcpu(11, 0, 100, 0), vcpu(12, 7, 7, 1)], eDelta: new Map([[0, 40n]]), maxTicks });
    expect(credits).toEqual([20n, 0n]);
    expect(s.vpkgCounter).toEqual([10, 0]);
    expect(s.nbVcpu.get(0)).toBe(2);
  });
});
