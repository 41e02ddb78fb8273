/** The ratio engine's state as plain data: what a restart carries to go on as if none happened (docs/ratio.md "Restart"). */
import { MAX_TID, validVcpus, type VcpuSpec } from '../model/vcpus.js';

/** pending: registered since the last sample (the next one is its baseline); active; ended: frozen. */
export type EnginePhase = 'pending' | 'active' | 'ended';

/** What the previous sample said about one thread (utime + stime in ticks); (tid, starttime) is its identity. */
export interface ThreadMark {
  starttime: number;
  ticks: number;
}

export interface EngineVmState {
  /** The v2 host VM id. */
  id: number;
  pid: number;
  starttime: number;
  name?: string;
  vcpus: VcpuSpec[];
  phase: EnginePhase;
  endedBy?: 'exit' | 'unregister';
  /** A(v,g) in joules; its length is the VM's nvpkg. */
  accJ: number[];
  domainAccJ?: { domain: string; accJ: number[] }[];
  /** Sample time of the published values; 0n before the first interval. */
  tNs: bigint;
  /** The threads of the last sample (active VMs only). */
  prev: (ThreadMark & { tid: number })[];
}

export interface EngineState {
  /** The id the next register() gives: above every VM's id. */
  nextId: number;
  /** Each counter (mod its range) as last read; a package missing there has no entry. */
  lastSample: { tNs: bigint; energy: { pkg: number; raw: number }[]; domains?: { domain: string; pkg: number; raw: number }[] } | null;
  vms: EngineVmState[];
}

/** The first inconsistent value of `s` for an engine whose counters have the ranges `rangeOf` gives (undefined: not read), or null. */
export function engineStateProblem(s: EngineState, rangeOf: (domain: string, pkg: number) => bigint | undefined): string | null {
  if (!Number.isSafeInteger(s.nextId) || s.nextId < 1) return `the next VM id ${s.nextId} is not a positive integer`;
  const last = s.lastSample;
  if (last !== null) {
    if (last.tNs < 0n) return `the last sample's time ${last.tNs} ns is negative`;
    const seen = new Set<number>();
    for (const e of last.energy) {
      const range = rangeOf('package', e.pkg);
      if (range === undefined) return `the last sample has a counter for package ${e.pkg}, which the host does not have`;
      if (seen.has(e.pkg)) return `the last sample has package ${e.pkg} twice`;
      seen.add(e.pkg);
      if (!Number.isSafeInteger(e.raw) || e.raw < 0 || e.raw >= Number(range))
        return `package ${e.pkg}'s counter ${e.raw} is out of its range (0..${range - 1n})`;
    }
    for (const d of last.domains ?? []) {
      const range = d.domain === 'package' ? undefined : rangeOf(d.domain, d.pkg);
      // A domain this engine does not read is ignored; one it reads must fit its counter.
      if (range !== undefined && (!Number.isSafeInteger(d.raw) || d.raw < 0 || d.raw >= Number(range)))
        return `the ${d.domain} counter ${d.raw} of package ${d.pkg} is out of its range`;
    }
  }
  const ids = new Set<number>();
  for (const v of s.vms) {
    const at = `VM ${v.id}`;
    if (!Number.isSafeInteger(v.id) || v.id < 1 || v.id >= s.nextId) return `VM id ${v.id} is out of range (1..${s.nextId - 1})`;
    if (ids.has(v.id)) return `VM id ${v.id} appears twice`;
    ids.add(v.id);
    if (!Number.isInteger(v.pid) || v.pid < 1 || v.pid > MAX_TID) return `${at}: pid ${v.pid} is out of range`;
    if (!Number.isSafeInteger(v.starttime) || v.starttime < 0) return `${at}: starttime ${v.starttime} is not a whole number of ticks`;
    let nvpkg = 0;
    try {
      for (const c of validVcpus(v.vcpus, { allowEmpty: true })) nvpkg = Math.max(nvpkg, c.vpkg + 1);
    } catch (e) {
      return `${at}: ${(e as Error).message}`;
    }
    if (v.accJ.length < nvpkg) return `${at}: ${v.accJ.length} energy totals for ${nvpkg} virtual packages`;
    if (v.accJ.some((a) => !Number.isFinite(a) || a < 0)) return `${at}: an energy total is not a finite number of joules >= 0`;
    for (const d of v.domainAccJ ?? []) {
      if (d.accJ.length > v.accJ.length) return `${at}: ${d.accJ.length} ${d.domain} totals for ${v.accJ.length} virtual packages`;
      if (d.accJ.some((a) => !Number.isFinite(a) || a < 0))
        return `${at}: a ${d.domain} energy total is not a finite number of joules >= 0`;
    }
    if (v.tNs < 0n || (last !== null && v.tNs > last.tNs)) return `${at}: its values' time ${v.tNs} ns is after the last sample`;
    if (v.phase !== 'pending' && v.phase !== 'active' && v.phase !== 'ended') return `${at}: unknown phase ${String(v.phase)}`;
    if (v.phase === 'active' && last === null) return `${at} has had its baseline sample, but there is no last sample`;
    if (v.phase !== 'active' && v.prev.length > 0) return `${at} is ${v.phase} but has thread marks`;
    const tids = new Set<number>();
    for (const m of v.prev) {
      if (tids.has(m.tid)) return `${at}: thread ${m.tid} is marked twice`;
      tids.add(m.tid);
      if (!Number.isSafeInteger(m.ticks) || m.ticks < 0 || !Number.isSafeInteger(m.starttime) || m.starttime < 0)
        return `${at}: thread ${m.tid}'s mark is out of range`;
    }
  }
  return null;
}
