/**
 * QEMU's garbage, kept apart (docs/guest-energy.md, "Limits"): a forecast answer may give a non-zero
 * e_delta on a package where a listed thread exited (an exit and a new thread in one window), and its
 * underflowed share goes into QEMU's never-reset e_ratio. A shadow of QEMU's loop without it (the
 * delta counted 0) says what the guest is owed credit for while the garbage decays. Pure.
 */
import { copyLoopState, deltaTicks, runIteration, type LoopState, type LoopThread } from './qemu-vmsr-loop.js';

const U64_HALF = 1n << 63n;

/** A thread whose tick delta, as QEMU computes it, underflows (it exited, or its tid is another thread's). */
function underflowed(t: LoopThread): boolean {
  return deltaTicks(t) >= U64_HALF;
}

/**
 * The shadow to run beside QEMU's loop for this window: the one already running, or a copy of the
 * loop now when a thread underflows on a package given a non-zero e_delta; undefined otherwise.
 */
export function shadowFor(
  loop: LoopState,
  running: LoopState | undefined,
  threads: readonly LoopThread[],
  eDelta: ReadonlyMap<number, bigint>,
): LoopState | undefined {
  if (running !== undefined) return running;
  return threads.some((t) => underflowed(t) && (eDelta.get(t.pkg) ?? 0n) > 0n) ? copyLoopState(loop) : undefined;
}

/** The shadow's credit for the window (changed in place): QEMU's iteration with every underflowed delta counted 0. */
export function shadowCredit(
  shadow: LoopState,
  w: { threads: readonly LoopThread[]; eDelta: ReadonlyMap<number, bigint>; maxTicks: ReadonlyMap<number, number> },
): number {
  const threads = w.threads.map((t) => (underflowed(t) ? { ...t, ticks1: t.ticks0 } : t));
  let sum = 0;
  for (const c of runIteration(shadow, { ...w, threads })) sum += Number(c);
  return sum;
}

/** Whether QEMU's loop has shed the garbage: its carried shares are the shadow's again. */
export function garbageGone(loop: LoopState, shadow: LoopState): boolean {
  for (const [p, r] of loop.eRatio) if ((shadow.eRatio.get(p) ?? 0n) !== r) return false;
  return true;
}
