/**
 * A pure model of one iteration of QEMU's vmsr thread (`kvm_msr_energy_thread` in target/i386/kvm/kvm.c, helpers
 * in vmsr_energy.c), the same in every version MODELLED_QEMU (helper/guest/guest-energy.ts) names. Per iteration
 * QEMU lists its threads (all but the main one), reads each one's utime+stime and CPU, asks the helper for the
 * package counter of each host package a thread sat on (e_start), sleeps a nominal 1 s, asks again (e_end), reads
 * the ticks again, and then, with C's types:
 *
 *   e_delta[p]  = e_end > e_start ? e_end - e_start : 0                    (u64; a wrap gives 0)
 *   delta_ticks = (utime1 + stime1) - (utime0 + stime0)                    (u64; an exited thread reads 0: underflow)
 *   nb_vcpu[p] += each vCPU thread whose start CPU is on p                 (never reset)
 *   e_ratio[p] += lround(ratio(e_delta[p], delta, maxticks[p]))  for non-vCPU threads with delta > 0 (never reset)
 *   e_ratio[p]  = e_ratio[p] / nb_vcpu[p]                  for every p with nb_vcpu[p] > 0 (integer division)
 *   vpkg[g]    += lround(ratio(...)) + e_ratio[p]          for each vCPU thread with delta > 0 (u32: wraps)
 *
 * where ratio(e, d, m) = (e / 100.0) * ((100.0 / m) * d) in double and maxticks[p] = CLK_TCK x the
 * package's CPUs (the nominal 1 s, never the measured sleep). The guest reads vpkg[g] as its
 * MSR_PKG_ENERGY_STATUS. Everything here is integer-exact against the C (BigInt where C has u64).
 */

export interface LoopThread {
  tid: number;
  /** Host package of the CPU QEMU read at the start (the package it asked the counter of). */
  pkg: number;
  ticks0: number;
  /** null when the stat could not be read (the thread exited): QEMU then reads 0. */
  ticks1: number | null;
  /** For a vCPU thread only. */
  vpkg?: number;
}

/** What QEMU carries from one iteration to the next: e_ratio (u64), nb_vcpu and vpkgs_energy_stat (unsigned int). */
export interface LoopState {
  eRatio: Map<number, bigint>;
  nbVcpu: Map<number, number>;
  vpkgCounter: number[];
}

interface LoopWindow {
  threads: readonly LoopThread[];
  eDelta: ReadonlyMap<number, bigint>;
  maxTicks: ReadonlyMap<number, number>;
}

const U32 = 2 ** 32;
/** What lround returns on x86-64 for a value past LONG_MAX (cvttsd2si's "integer indefinite"), as u64. */
const LROUND_OVERFLOW = 1n << 63n;

export function freshLoopState(nvpkg: number): LoopState {
  return { eRatio: new Map(), nbVcpu: new Map(), vpkgCounter: new Array<number>(nvpkg).fill(0) };
}

export function copyLoopState(s: LoopState): LoopState {
  return { eRatio: new Map(s.eRatio), nbVcpu: new Map(s.nbVcpu), vpkgCounter: [...s.vpkgCounter] };
}

export function deltaTicks(t: LoopThread): bigint {
  return BigInt.asUintN(64, BigInt(t.ticks1 ?? 0) - BigInt(t.ticks0));
}

/** (uint64_t)lround(vmsr_get_ratio(e_delta, delta_ticks, maxticks)). */
export function ratioUnits(eDelta: bigint, delta: bigint, maxTicks: number): bigint {
  return lroundU64((Number(eDelta) / 100.0) * ((100.0 / maxTicks) * Number(delta)));
}

/** lround (half away from zero) cast to u64, for the non-negative values the loop produces. */
export function lroundU64(x: number): bigint {
  if (!(x < 2 ** 63)) return LROUND_OVERFLOW;
  const f = Math.floor(x);
  return BigInt(x - f >= 0.5 ? f + 1 : f);
}

/** Runs one iteration on `s` in place; returns each virtual package's credit before the u32 wrap. */
export function runIteration(s: LoopState, w: LoopWindow): bigint[] {
  // A virtual package met for the first time was at 0 in QEMU all along.
  for (const t of w.threads) if (t.vpkg !== undefined) while (s.vpkgCounter.length <= t.vpkg) s.vpkgCounter.push(0);
  const credits = s.vpkgCounter.map(() => 0n);
  const deltas = w.threads.map(deltaTicks);
  const eDelta = (p: number) => w.eDelta.get(p) ?? 0n;
  const maxTicks = (p: number) => w.maxTicks.get(p) ?? 1;
  for (const t of w.threads) if (t.vpkg !== undefined) s.nbVcpu.set(t.pkg, ((s.nbVcpu.get(t.pkg) ?? 0) + 1) >>> 0);
  w.threads.forEach((t, i) => {
    if (t.vpkg !== undefined || deltas[i] === 0n) return;
    const add = ratioUnits(eDelta(t.pkg), deltas[i]!, maxTicks(t.pkg));
    s.eRatio.set(t.pkg, BigInt.asUintN(64, (s.eRatio.get(t.pkg) ?? 0n) + add));
  });
  for (const [p, nb] of s.nbVcpu) if (nb > 0) s.eRatio.set(p, (s.eRatio.get(p) ?? 0n) / BigInt(nb));
  w.threads.forEach((t, i) => {
    if (t.vpkg === undefined || deltas[i] === 0n) return;
    const add = ratioUnits(eDelta(t.pkg), deltas[i]!, maxTicks(t.pkg)) + (s.eRatio.get(t.pkg) ?? 0n);
    credits[t.vpkg] = credits[t.vpkg]! + add;
    s.vpkgCounter[t.vpkg] = Number(BigInt.asUintN(32, BigInt(s.vpkgCounter[t.vpkg]!) + add)) % U32;
  });
  return credits;
}

export function qemuEnergyDelta(eStart: bigint, eEnd: bigint): bigint {
  const a = BigInt.asUintN(64, eStart);
  const b = BigInt.asUintN(64, eEnd);
  return b > a ? b - a : 0n;
}
