/**
 * The guest counters' section of the state snapshot (version 3 on; docs/guest-energy.md "Restarts"):
 *
 *   u32 count, each: u32 vmId | u32 pid | u64 starttime | u32 windows | u32 carriedWindows
 *     | f64 owedUnits | f64 creditedUnits | f64 lastExactJ
 *     | u8 phase (0 none, 1 start, 2 end) | u8 has start read | u16 asked | u64 phase startNs
 *     | u16 count, each u32 pkg (the start phase's packages)
 *     | u16 count, each u32 pkg | f64 counter
 *     | u16 count, each u32 pkg | u64 e_ratio | u32 nb_vcpu
 *     | u16 count, each u32 vpkg counter
 *     | [u32 count, each u32 tid | u64 ticks | u64 starttime | u32 pkg + 1]   (the start read, when there is one)
 */
import type { GuestCounterState, ThreadRead } from '../guest-energy/guest-counter.js';
import { Refused, type Reader, type Writer } from './byte-io.js';
import { STATE_LIMITS } from './snapshot.js';

const PHASES = [null, 'start', 'end'] as const;
const MAX_VPKGS = 256;

export function writeGuestCounters(w: Writer, list: readonly GuestCounterState[]): void {
  w.list(4, list, (g) => {
    w.u32(g.vmId).u32(g.pid).u64(g.starttime).u32(g.windows).u32(g.carriedWindows);
    w.f64(g.owedUnits).f64(g.creditedUnits).f64(g.lastExactJ);
    w.u8(PHASES.indexOf(g.phases.kind)).u8(g.start !== null ? 1 : 0);
    w.u16(g.phases.asked).u64(g.phases.startNs);
    w.list(2, g.phases.pkgs, (p) => w.u32(p));
    w.list(2, [...g.counters], ([p, v]) => w.u32(p).f64(v));
    const loopPkgs = [...new Set([...g.loop.eRatio.keys(), ...g.loop.nbVcpu.keys()])];
    w.list(2, loopPkgs, (p) => {
      w.u32(p).u64(g.loop.eRatio.get(p) ?? 0n);
      w.u32(g.loop.nbVcpu.get(p) ?? 0);
    });
    w.list(2, g.loop.vpkgCounter, (v) => w.u32(v));
    if (g.start === null) return;
    w.list(4, [...g.start.values()], (t) => {
      w.u32(t.tid).u64(t.ticks).u64(t.starttime);
      w.u32(t.pkg + 1);
    });
  });
}

export function readGuestCounters(r: Reader): GuestCounterState[] {
  return r.list(4, STATE_LIMITS.maxGuestCounters, 68, 'guest counters', () => readOne(r));
}

/** Its numbers are checked with the whole snapshot (stateProblem). */
function readOne(r: Reader): GuestCounterState {
  const at = 'guest counters';
  const [vmId, pid, starttime, windows, carriedWindows] = [r.u32(at), r.u32(at), r.safe(at), r.u32(at), r.u32(at)];
  const [owedUnits, creditedUnits, lastExactJ] = [r.f64(at), r.f64(at), r.f64(at)];
  const kind = PHASES[r.u8(at)];
  if (kind === undefined) throw new Refused('a guest counter has an unknown phase');
  const [hasStart, asked, startNs] = [r.u8(at), r.u16(at), r.u64(at)];
  const pkgs = r.list(2, STATE_LIMITS.maxPackages, 4, at, () => r.u32(at));
  const counters = new Map(r.list(2, STATE_LIMITS.maxPackages, 12, at, () => [r.u32(at), r.f64(at)] as const));
  const loops = r.list(2, STATE_LIMITS.maxPackages, 16, at, () => [r.u32(at), r.u64(at), r.u32(at)] as const);
  const eRatio = new Map(loops.map(([p, e]) => [p, e]));
  const nbVcpu = new Map(loops.map(([p, , n]) => [p, n]));
  const vpkgCounter = r.list(2, MAX_VPKGS, 4, at, () => r.u32(at));
  const reads = (): ThreadRead => ({ tid: r.u32(at), ticks: r.safe(at), starttime: r.safe(at), pkg: r.u32(at) - 1 });
  const start = hasStart === 1 ? new Map(r.list(4, STATE_LIMITS.maxThreads, 24, at, reads).map((t) => [t.tid, t])) : null;
  return {
    vmId,
    pid,
    starttime,
    counters,
    loop: { eRatio, nbVcpu, vpkgCounter },
    phases: { kind, startNs, pkgs, asked },
    start,
    owedUnits,
    creditedUnits,
    lastExactJ,
    windows,
    carriedWindows,
  };
}

/** Why the guest counters break a rule, or null. */
export function guestCountersProblem(list: readonly GuestCounterState[]): string | null {
  if (list.length > STATE_LIMITS.maxGuestCounters) return `${list.length} guest counters, at most ${STATE_LIMITS.maxGuestCounters}`;
  for (const g of list) {
    if (!Number.isFinite(g.owedUnits) || !Number.isFinite(g.creditedUnits) || !Number.isFinite(g.lastExactJ))
      return `VM ${g.vmId}: a guest counter holds a number that is not finite`;
    if (g.loop.vpkgCounter.length > MAX_VPKGS) return `VM ${g.vmId}: ${g.loop.vpkgCounter.length} virtual packages, at most ${MAX_VPKGS}`;
    for (const v of g.counters.values()) if (!Number.isSafeInteger(v) || v < 0) return `VM ${g.vmId}: a guest counter ${v} is out of range`;
  }
  return null;
}
