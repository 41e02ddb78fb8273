/**
 * QEMU's garbage (docs/guest-energy.md, "Limits"): a forecast may give a non-zero e_delta where a thread
 * exited, whose underflowed share enters QEMU's never-reset e_ratio. A shadow loop without it says what
 * the guest is owed while the garbage decays.
 */
import { copyLoopState, deltaTicks, runIteration, type LoopState, type LoopThread } from './qemu-vmsr-loop.js';

const U64_HALF = 1n << 63n;

function underflowed(t: LoopThread): boolean {
  return deltaTicks(t) >= U64_HALF;
}

/** The shadow already running, or a copy of the loop when a thread underflows on a package given a non-zero e_delta. */
export function shadowFor(
  loop: LoopState,
  running: LoopState | undefined,
  threads: readonly LoopThread[],
  eDelta: ReadonlyMap<number, bigint>,
): LoopState | undefined {
  if (running !== undefined) return running;
  return threads.some((t) => underflowed(t) && (eDelta.get(t.pkg) ?? 0n) > 0n) ? copyLoopState(loop) : undefined;
}

/** QEMU's iteration on the shadow (in place) with every underflowed delta counted 0. */
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
