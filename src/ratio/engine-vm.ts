/** A VM as the ratio engine keeps it (EngineVm), from register() or a restart's state to its end. Pure. */
import { parseStatLine } from './stat.js';
import { validVcpus, type VcpuSpec } from '../model/vcpus.js';
import type { EnginePhase, EngineVmState, ThreadMark } from './engine-state.js';
import type { Sample } from '../model/sample.js';
import type { VmSpec } from '../model/vm.js';

/** tid -> vpkg of a vCPU list (model/vcpus.ts), or its error. Empty is taken here alone: every way in from outside refuses it. */
export function checkedVcpus(vcpus: readonly VcpuSpec[]): Map<number, number> {
  const out = new Map<number, number>();
  for (const v of validVcpus(vcpus, { allowEmpty: true })) out.set(v.tid, v.vpkg);
  return out;
}

interface ThreadStat extends ThreadMark {
  processor: number;
}

/** A thread's line as last parsed, reused while the sampler hands the same line again (an idle thread's). */
interface ParsedLine {
  line: string;
  /** null: the line counts as absent, for `problem`. */
  stat: ThreadStat | null;
  problem: string;
}

export interface EngineVm {
  id: number;
  spec: VmSpec;
  vcpuVpkg: Map<number, number>;
  nvpkg: number;
  phase: EnginePhase;
  /** Threads seen in the previous sample (active VMs only). */
  prev: Map<number, ThreadMark>;
  /** tid -> its last line, parsed (live VMs only). */
  parsed: Map<number, ParsedLine>;
  /** A(v,g), joules. */
  acc: number[];
  /** Counts the changes of its totals but the sample time: totalsInto skips what did not move. */
  changes: number;
  /** A(v,g) of each other domain the host reads (DomainPlane order), joules. */
  domainAcc: number[][];
  /** Sample time of the published values; 0n before the first interval. */
  tNs: bigint;
  endedBy?: 'exit' | 'unregister';
  /** Per thread since the baseline: energy given to it as a vCPU (its share and its part of W), J, and its ticks. */
  threads?: Map<number, { energyJ: number; ticks: number }>;
}

/** Virtual packages of a vCPU map: one past the highest vpkg (at least `atLeast`). */
export function nvpkgOf(vcpuVpkg: ReadonlyMap<number, number>, atLeast = 0): number {
  let n = atLeast;
  for (const g of vcpuVpkg.values()) n = Math.max(n, g + 1);
  return n;
}

export function newEngineVm(id: number, vm: VmSpec, domains: number): EngineVm {
  const vcpuVpkg = checkedVcpus(vm.vcpus);
  const nvpkg = nvpkgOf(vcpuVpkg);
  return {
    id,
    spec: { ...vm, vcpus: vm.vcpus.map((v) => ({ ...v })) },
    vcpuVpkg,
    nvpkg,
    phase: 'pending',
    prev: new Map(),
    parsed: new Map(),
    acc: new Array<number>(nvpkg).fill(0),
    changes: 0,
    domainAcc: Array.from({ length: domains }, () => new Array<number>(nvpkg).fill(0)),
    tNs: 0n,
  };
}

/** A VM as plain data (copies), its other domains' totals named by `domains`. */
export function vmState(vm: EngineVm, domains: readonly string[]): EngineVmState {
  const out: EngineVmState = {
    id: vm.id,
    pid: vm.spec.pid,
    starttime: vm.spec.starttime,
    vcpus: vm.spec.vcpus.map((v) => ({ ...v })),
    phase: vm.phase,
    accJ: [...vm.acc],
    tNs: vm.tNs,
    prev: [...vm.prev].map(([tid, m]) => ({ tid, starttime: m.starttime, ticks: m.ticks })),
  };
  if (domains.length > 0) out.domainAccJ = domains.map((domain, i) => ({ domain, accJ: [...vm.domainAcc[i]!] }));
  if (vm.spec.name !== undefined) out.name = vm.spec.name;
  if (vm.endedBy !== undefined) out.endedBy = vm.endedBy;
  return out;
}

/** vmState's VM back (checked by engineStateProblem first), with the engine's other `domains`. */
export function vmFromState(v: EngineVmState, domains: readonly string[]): EngineVm {
  const spec: VmSpec = { pid: v.pid, starttime: v.starttime, vcpus: v.vcpus };
  if (v.name !== undefined) spec.name = v.name;
  const vm = newEngineVm(v.id, spec, 0);
  vm.nvpkg = v.accJ.length;
  vm.phase = v.phase;
  vm.prev = new Map(v.prev.map((m) => [m.tid, { starttime: m.starttime, ticks: m.ticks }]));
  vm.acc = [...v.accJ];
  // A domain this engine reads that the state lacks starts at 0; one it does not read is dropped.
  vm.domainAcc = domains.map((domain) => {
    const acc = v.domainAccJ?.find((d) => d.domain === domain)?.accJ ?? [];
    return Array.from({ length: v.accJ.length }, (_, g) => acc[g] ?? 0);
  });
  vm.tNs = v.tNs;
  if (v.phase === 'ended') vm.endedBy = v.endedBy ?? 'exit';
  return vm;
}

/** Its totals stay, its marks go. */
export function endVm(vm: EngineVm, by: 'exit' | 'unregister' = 'exit'): void {
  vm.phase = 'ended';
  vm.changes++;
  vm.endedBy = by;
  vm.prev = new Map();
  vm.parsed = new Map();
}

/** The VM's parsed threads in this sample (bad lines reported and left out), or null when it ended: pid gone or reused. */
export function aliveThreads(vm: EngineVm, s: Sample, problems: string[]): Map<number, ThreadStat> | null {
  const pid = vm.spec.pid;
  const lines = s.tasks.get(pid);
  if (lines === undefined) return null;
  const cache = vm.parsed;
  const out = new Map<number, ThreadStat>();
  for (const [tid, line] of lines) {
    let c = cache.get(tid);
    if (c === undefined || c.line !== line) {
      c = parseThread(pid, tid, line);
      cache.set(tid, c);
    }
    if (c.stat === null) problems.push(c.problem);
    else out.set(tid, c.stat);
  }
  if (cache.size > lines.size) for (const tid of cache.keys()) if (!lines.has(tid)) cache.delete(tid);
  // A missing or unreadable main-thread line cannot prove the pid was reused: the VM stays.
  const main = out.get(pid);
  if (main !== undefined && main.starttime !== vm.spec.starttime) return null;
  return out;
}

/** Each vCPU's energy and ticks since the VM's baseline into `vcpus` (tids set); returns the other threads' ticks. */
export function fillThreadTotals(vm: EngineVm, vcpus: { tid: number; energyJ: number; ticks: number }[]): number {
  const t = vm.threads;
  let vcpuTicks = 0;
  for (const v of vcpus) {
    const k = t?.get(v.tid);
    v.energyJ = k?.energyJ ?? 0;
    v.ticks = k?.ticks ?? 0;
    vcpuTicks += v.ticks;
  }
  let all = 0;
  if (t) for (const k of t.values()) all += k.ticks;
  return Math.max(0, all - vcpuTicks);
}

/** A thread's stat line parsed for the rules (docs/ratio.md, "Reading a stat line"), or why it counts as absent. */
function parseThread(pid: number, tid: number, line: string): ParsedLine {
  const parsed = parseStatLine(line);
  if (!parsed.ok)
    return { line, stat: null, problem: `pid ${pid} tid ${tid}: stat line not understood (${parsed.error}): treated as absent` };
  const st = parsed.value;
  if (st.tid !== tid) return { line, stat: null, problem: `pid ${pid} tid ${tid}: stat line is for tid ${st.tid}: treated as absent` };
  return { line, stat: { starttime: st.starttime, ticks: st.utime + st.stime, processor: st.processor }, problem: '' };
}
