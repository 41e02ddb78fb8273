/**
 * A QEMU process in exact mode: listening (answered raw, its windows counted so the model's vCPU count
 * starts right) until its VM is known and modelled, then exact. After a restart either answers 0 until
 * a request comes soon after the last (`resyncNs`: a window's start).
 */
import type { GuestCounterState } from './guest-counter.js';
import { freshPhases, MIN_SLEEP_NS, nextPhase, type PhaseState } from './window-phases.js';

export type Exact<W> = { at: 'exact'; counter: GuestCounterState } & W;

export interface PeerPhase<W> {
  phase: { at: 'listening'; phases: PhaseState; windowsSeen: number } | Exact<W>;
  resyncNs?: bigint;
}

/** 'begin': try exact from this window on; 'exact': the counters' step. */
export function requestStep<W>(p: PeerPhase<W>, pkg: number, nowNs: bigint): 'zero' | 'raw' | 'begin' | 'exact' {
  const s = p.phase;
  if (p.resyncNs !== undefined) {
    const last = p.resyncNs;
    p.resyncNs = nowNs;
    if (nowNs - last >= MIN_SLEEP_NS) return 'zero';
    delete p.resyncNs;
    if (s.at === 'exact') s.counter.phases = freshPhases();
    else s.phases = freshPhases();
  }
  if (s.at === 'exact') return 'exact';
  const step = nextPhase(s.phases, pkg, nowNs);
  if (step.kind !== 'start' || !step.first) return 'raw';
  s.windowsSeen++;
  return 'begin';
}
