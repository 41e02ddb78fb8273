/**
 * Which of QEMU's vmsr iterations a MSR_PKG_ENERGY_STATUS request belongs to, and whether it is its
 * first read (e_start) or its second (e_end). QEMU asks one request per host package its threads sat
 * on, ascending; sleeps 1 s; asks the same packages again; then starts the next iteration at once. So
 * an end phase asks exactly the packages of the start phase before it, at least 1 s after it began;
 * anything else begins a start phase. Pure: the caller gives the time (CLOCK_MONOTONIC, ns).
 */

/** A start phase's end read cannot come sooner than this after its first read (QEMU sleeps 1 s). */
export const MIN_SLEEP_NS = 900_000_000n;

type PhaseKind = 'start' | 'end';

interface PhaseStep {
  kind: PhaseKind;
  /** The first request of its phase (an end phase's first request closes the window). */
  first: boolean;
}

/** Plain data, for the restart state. */
export interface PhaseState {
  kind: PhaseKind | null;
  /** When the current start phase (or the start phase an end phase answers) began. */
  startNs: bigint;
  /** Packages of the last start phase, in order. */
  pkgs: number[];
  /** In an end phase: how many of `pkgs` it has asked. */
  asked: number;
}

export function freshPhases(): PhaseState {
  return { kind: null, startNs: 0n, pkgs: [], asked: 0 };
}

/** Classifies one request for host package `pkg` at `nowNs`, updating `s`. */
export function nextPhase(s: PhaseState, pkg: number, nowNs: bigint): PhaseStep {
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
