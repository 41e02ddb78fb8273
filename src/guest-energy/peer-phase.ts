/**
 * A QEMU process asking for MSR_PKG_ENERGY_STATUS, as exact mode sees it (docs/guest-energy.md):
 * listening (its windows counted, answered raw, until its VM is known and its QEMU modelled), then
 * exact (answered from its counters). Either may be resynchronising after a restart: answered 0
 * until a request comes soon after the last, which can only be a window's start. Pure: the caller
 * gives the time (CLOCK_MONOTONIC, ns) and does the I/O a step asks for.
 */
import type { GuestCounterState } from './guest-counter.js';
import { freshPhases, MIN_SLEEP_NS, nextPhase, type PhaseState } from './window-phases.js';

/** Before exact: QEMU's windows, counted so that the model's vCPU count starts right. */
export interface Listening {
  at: 'listening';
  phases: PhaseState;
  windowsSeen: number;
}

/** Exact: the counters, and `W`, what the caller keeps beside them (its reads and held fds). */
export type Exact<W> = { at: 'exact'; counter: GuestCounterState } & W;

export interface PeerPhase<W> {
  phase: Listening | Exact<W>;
  /** Answered 0 since a restart (its QEMU may be in a window whose one side was 0): the time of the last request. */
  resyncNs?: bigint;
}

/** What to do with a request: answer 0, answer raw, try exact from this window on, or the counters' step. */
export type RequestStep = 'zero' | 'raw' | 'begin' | 'exact';

export function listening(windowsSeen = 0, phases = freshPhases()): Listening {
  return { at: 'listening', phases, windowsSeen };
}

/** Classifies one request for host package `pkg` at `nowNs`, updating `p`. */
export function requestStep<W>(p: PeerPhase<W>, pkg: number, nowNs: bigint): RequestStep {
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
