/**
 * Whether a request is an iteration's e_start or e_end read. QEMU asks each host package its threads sat
 * on, ascending; sleeps 1 s; asks the same packages again: anything else begins a start phase.
 */

/** QEMU sleeps 1 s between the phases. */
export const MIN_SLEEP_NS = 900_000_000n;

type PhaseKind = 'start' | 'end';

export interface PhaseState {
  kind: PhaseKind | null;
  /** When the last start phase began (CLOCK_MONOTONIC). */
  startNs: bigint;
  pkgs: number[];
  /** In an end phase: how many of `pkgs` it has asked. */
  asked: number;
}

export function freshPhases(): PhaseState {
  return { kind: null, startNs: 0n, pkgs: [], asked: 0 };
}

export function nextPhase(s: PhaseState, pkg: number, nowNs: bigint): { kind: PhaseKind; first: boolean } {
  if (s.kind === 'start') {
    if (nowNs - s.startNs >= MIN_SLEEP_NS && s.pkgs[0] === pkg) {
      s.kind = 'end';
      s.asked = 1;
      return { kind: 'end', first: true };
    }
    if (nowNs - s.startNs < MIN_SLEEP_NS && pkg > s.pkgs.at(-1)!) {
      s.pkgs.push(pkg);
      return { kind: 'start', first: false };
    }
  } else if (s.kind === 'end' && s.asked < s.pkgs.length && s.pkgs[s.asked] === pkg) {
    s.asked++;
    return { kind: 'end', first: false };
  }
  s.kind = 'start';
  s.startNs = nowNs;
  s.pkgs = [pkg];
  s.asked = 0;
  return { kind: 'start', first: true };
}
