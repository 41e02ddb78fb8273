/**
 * The e_delta to give QEMU for one host package so that its unmodified arithmetic (qemu-vmsr-loop.ts)
 * credits the VM's virtual packages at most `target` units in total, and as close to it as QEMU's
 * rounding allows. What QEMU credits from package p depends only on p's e_delta (every thread's
 * share is taken at the price of the package it sat on), and grows with it: a binary search over
 * e_delta on a copy of QEMU's state finds the largest that does not pass the target.
 */
import { copyLoopState, deltaTicks, runIteration, type LoopState, type LoopThread } from './qemu-vmsr-loop.js';

/** A window's threads on package p, and QEMU's state before it. */
export interface PackageProblem {
  state: LoopState;
  pkg: number;
  threads: readonly LoopThread[];
  maxTicks: number;
  /** Units the VM should be credited from this package in this window (>= 0). */
  target: bigint;
}

/** What QEMU would credit in total (every virtual package) from package p given e_delta = e. */
export function creditedFrom(pr: PackageProblem, e: bigint): bigint {
  const s = copyLoopState(pr.state);
  const credits = runIteration(s, { threads: pr.threads, eDelta: new Map([[pr.pkg, e]]), maxTicks: new Map([[pr.pkg, pr.maxTicks]]) });
  let sum = 0n;
  for (const c of credits) sum += c;
  return sum;
}

/**
 * Whether QEMU can be given any energy on this package at all: a thread whose end read fails or
 * whose ticks went back (an exit, a reused tid) makes QEMU's u64 tick delta underflow, and only an
 * e_delta of 0 keeps that out of its counters.
 */
export function underflows(threads: readonly LoopThread[]): boolean {
  return threads.some((t) => t.ticks1 === null ? t.ticks0 > 0 : t.ticks1 < t.ticks0);
}

/** The largest e_delta whose credit is at most the target (0 when nothing can be credited safely). */
export function solveDelta(pr: PackageProblem): bigint {
  if (pr.target <= 0n || underflows(pr.threads)) return 0n;
  let vcpuTicks = 0n;
  for (const t of pr.threads) if (t.vpkg !== undefined) vcpuTicks += deltaTicks(t);
  if (vcpuTicks === 0n) return 0n;
  // Each vCPU is credited at least e x d / maxticks - 1/2, so this bound credits more than the target.
  let hi = ((pr.target + BigInt(pr.threads.length)) * BigInt(pr.maxTicks)) / vcpuTicks + 2n;
  let lo = 0n;
  if (creditedFrom(pr, 0n) > pr.target) return 0n;
  while (creditedFrom(pr, hi) <= pr.target) hi *= 2n;
  // Invariant: credit(lo) <= target < credit(hi).
  while (hi - lo > 1n) {
    const mid = (lo + hi) / 2n;
    if (creditedFrom(pr, mid) <= pr.target) lo = mid;
    else hi = mid;
  }
  return lo;
}
