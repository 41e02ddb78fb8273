/**
 * The largest e_delta for one host package whose credit under QEMU's arithmetic (qemu-vmsr-loop.ts) does
 * not pass `target`: the credit from p depends only on p's e_delta and grows with it, so a bounded search.
 */
import { deltaTicks, ratioUnits, type LoopState, type LoopThread } from './qemu-vmsr-loop.js';

interface PackageProblem {
  state: LoopState;
  pkg: number;
  threads: readonly LoopThread[];
  maxTicks: number;
  target: bigint;
}

const U64 = (1n << 64n) - 1n;

/** The credit from e_delta e, what does not depend on e worked out once (runIteration's arithmetic, on no copy of the state). */
export function creditOf(pr: Omit<PackageProblem, 'target'>): (e: bigint) => bigint {
  const others: bigint[] = [];
  const vcpus: bigint[] = [];
  let nb = pr.state.nbVcpu.get(pr.pkg) ?? 0;
  for (const t of pr.threads) if (t.vpkg !== undefined) nb = (nb + 1) >>> 0;
  for (const t of pr.threads) {
    const d = deltaTicks(t);
    if (d === 0n) continue;
    if (t.vpkg === undefined) others.push(d);
    else vcpus.push(d);
  }
  const carried = pr.state.eRatio.get(pr.pkg) ?? 0n;
  return (e) => {
    let ratio = carried;
    for (const d of others) ratio = (ratio + ratioUnits(e, d, pr.maxTicks)) & U64;
    if (nb > 0) ratio /= BigInt(nb);
    let sum = 0n;
    for (const d of vcpus) sum += ratioUnits(e, d, pr.maxTicks) + ratio;
    return sum;
  };
}

/** Credits worked out at most per search: the gallops and the bisection over u64 need about 200. */
export const MAX_SOLVER_STEPS = 400;

/** 0 when nothing can be credited safely; null when the search met its bound (the caller answers 0 and carries). */
export function solveDelta(pr: PackageProblem): bigint | null {
  // A thread that exited or whose tid was reused underflows QEMU's u64 tick delta: only e_delta 0 keeps it out of the counters.
  if (pr.target <= 0n || pr.threads.some((t) => (t.ticks1 === null ? t.ticks0 > 0 : t.ticks1 < t.ticks0))) return 0n;
  let vcpuTicks = 0n;
  for (const t of pr.threads) if (t.vpkg !== undefined) vcpuTicks += deltaTicks(t);
  if (vcpuTicks === 0n) return 0n;
  let steps = 0;
  const credit = creditOf(pr);
  const creditedFrom = (e: bigint) => (++steps > MAX_SOLVER_STEPS ? null : credit(e));
  // The credit is e x (vCPU ticks) / maxticks plus what does not grow with e, each vCPU rounding by at most 1/2: bracket the linear estimate.
  const base = credit(0n);
  if (base > pr.target) return 0n;
  const guess = min(U64, ((pr.target - base) * BigInt(pr.maxTicks)) / vcpuTicks);
  // The non-vCPU threads' share also grows with e, so the estimate may be high: gallop.
  let step = (BigInt(pr.threads.length + 1) * BigInt(pr.maxTicks)) / vcpuTicks + 1n;
  let lo = guess > step ? guess - step : 0n;
  for (let s = step; lo > 0n; s *= 2n) {
    const c = creditedFrom(lo);
    if (c === null) return null;
    if (c <= pr.target) break;
    lo = lo > s ? lo - s : 0n;
  }
  let hi = min(U64, guess + step);
  for (;;) {
    const c = creditedFrom(hi);
    if (c === null || (c <= pr.target && hi === U64)) return null;
    if (c > pr.target) break;
    lo = hi;
    hi = min(U64, hi + step);
    step *= 2n;
  }
  // Invariant: credit(lo) <= target < credit(hi).
  while (hi - lo > 1n) {
    const mid = (lo + hi) / 2n;
    const c = creditedFrom(mid);
    if (c === null) return null;
    if (c <= pr.target) lo = mid;
    else hi = mid;
  }
  return lo;
}

function min(a: bigint, b: bigint): bigint {
  return a < b ? a : b;
}
