/** The guest counters' section of the state snapshot (version 3 on; docs/guest-energy.md "Restarts"). */
import type { GuestCounterState, ThreadRead } from '../guest-energy/guest-counter.js';
import { Refused, type Io } from './byte-io.js';
import { STATE_LIMITS } from './snapshot.js';

const PHASES = [null, 'start', 'end'] as const;
const MAX_VPKGS = 256;

/** Its numbers are checked with the whole snapshot (stateProblem). */
export function guestCountersIo(io: Io, list?: readonly GuestCounterState[]): GuestCounterState[] {
  const [at, L] = ['guest counters', STATE_LIMITS];
  return io.list(4, list, L.maxGuestCounters, 68, at, (g) => {
    const [vmId, pid, starttime] = [io.u32(g?.vmId, at), io.u32(g?.pid, at), io.safe(g?.starttime, at)];
    const [windows, carriedWindows] = [io.u32(g?.windows, at), io.u32(g?.carriedWindows, at)];
    const [owedUnits, creditedUnits, lastExactJ] = [io.f64(g?.owedUnits, at), io.f64(g?.creditedUnits, at), io.f64(g?.lastExactJ, at)];
    const kind = PHASES[io.u8(g && PHASES.indexOf(g.phases.kind), at)];
    if (kind === undefined) throw new Refused('a guest counter has an unknown phase');
    const [hasStart, asked, startNs] = [io.u8(g && (g.start ? 1 : 0), at), io.u16(g?.phases.asked, at), io.u64(g?.phases.startNs, at)];
    const pkgs = io.list(2, g?.phases.pkgs, L.maxPackages, 4, at, (p) => io.u32(p, at));
    const counter = (e?: Counter): Counter => [io.u32(e?.[0], at), io.f64(e?.[1], at)];
    const counters = io.list(2, g && [...g.counters], L.maxPackages, 12, at, counter);
    const loop = (e?: Loop): Loop => [io.u32(e?.[0], at), io.u64(e?.[1], at), io.u32(e?.[2], at)];
    const loops = io.list(2, g && loopsOf(g), L.maxPackages, 16, at, loop);
    const vpkgCounter = io.list(2, g?.loop.vpkgCounter, MAX_VPKGS, 4, at, (v) => io.u32(v, at));
    const reads = (t?: ThreadRead): ThreadRead => {
      const [tid, ticks, starttime] = [io.u32(t?.tid, at), io.safe(t?.ticks, at), io.safe(t?.starttime, at)];
      return { tid, ticks, starttime, pkg: io.u32(t && t.pkg + 1, at) - 1 };
    };
    const start = hasStart === 1 ? io.list(4, g?.start ? [...g.start.values()] : undefined, L.maxThreads, 24, at, reads) : null;
    return (
      g ?? {
        vmId,
        pid,
        starttime,
        counters: new Map(counters),
        loop: { eRatio: new Map(loops.map(([p, e]) => [p, e])), nbVcpu: new Map(loops.map(([p, , n]) => [p, n])), vpkgCounter },
        phases: { kind, startNs, pkgs, asked },
        start: start && new Map(start.map((t) => [t.tid, t])),
        owedUnits,
        creditedUnits,
        lastExactJ,
        windows,
        carriedWindows,
      }
    );
  });
}

type Counter = [pkg: number, counter: number];
type Loop = [pkg: number, eRatio: bigint, nbVcpu: number];
/** The loop's state per package: a package in either map, 0 for the other. */
const loopsOf = (g: GuestCounterState): Loop[] =>
  [...new Set([...g.loop.eRatio.keys(), ...g.loop.nbVcpu.keys()])].map((p) => [p, g.loop.eRatio.get(p) ?? 0n, g.loop.nbVcpu.get(p) ?? 0]);

/** Why the guest counters break a rule, or null. */
export function guestCountersProblem(list: readonly GuestCounterState[]): string | null {
  for (const g of list) {
    if (!Number.isFinite(g.owedUnits) || !Number.isFinite(g.creditedUnits) || !Number.isFinite(g.lastExactJ))
      return `VM ${g.vmId}: a guest counter holds a number that is not finite`;
    for (const v of g.counters.values()) if (!Number.isSafeInteger(v) || v < 0) return `VM ${g.vmId}: a guest counter ${v} is out of range`;
  }
  return null;
}
