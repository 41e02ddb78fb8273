/** The live state as a snapshot (capture); a snapshot checked as each part's start (planRestore): docs/daemon.md "Restart state". */
import { cannot } from '../../common/errors.js';
import { fail, ok, type Result } from '../../common/result.js';
import { counterOfJoules, joulesPerCounterUnit } from '../../ratio/counter.js';
import { microjoules } from '../../ratio/outputs.js';
import { isOtherDomain } from '../../model/domains.js';
import type { EngineState, EngineVmState } from '../../ratio/engine-state.js';
import type { HostInfo } from '../../model/host.js';
import type { SamplingService, SamplingState } from '../../sampling/sampling-service.js';
import type { KnownProcessState } from '../../discovery/scanner.js';
import { stateProblem } from '../../state/snapshot-codec.js';
import type { DomainsState, PowerLimitState, SampledThread, StateSnapshot, VmState } from '../../state/snapshot.js';
import type { HostEnergyState } from './host-energy.js';
import type { VmRecord } from './vm-registry.js';

/** The longest restart gap attributed: past it the 32-bit package counter may have wrapped unseen (why --interval is at most 60 s). */
export const MAX_RESTORE_GAP_NS = 60_000_000_000n;

export const RESTORE_FIX = 'the daemon starts without it (registered VMs register again, discovery finds the rest)';

interface LiveParts {
  registry: { state(): VmRecord[] };
  sampling: Pick<SamplingService, 'state' | 'engine'>;
  energy: { state(): HostEnergyState };
  discovery?: { state(): KnownProcessState[] } | undefined;
  guestEnergy?: { state(): NonNullable<StateSnapshot['guest']> } | undefined;
  powerLimits?: { state(): PowerLimitState[] } | undefined;
}

/** The service's state as one snapshot, the counters at the guest energy unit; throws when the parts disagree. */
export function capture(p: LiveParts): StateSnapshot {
  const u = joulesPerCounterUnit(p.sampling.engine.guestPowerUnit);
  const { engine, realtimeNs } = p.sampling.state();
  const byId = new Map(engine.vms.map((v) => [v.id, v]));
  const vms: VmState[] = p.registry.state().map(({ vmId, notWhole: _, ...r }) => {
    const e = byId.get(vmId);
    if (e === undefined) throw new Error(cannot('save state', `VM ${vmId} is listed but not sampled`));
    return {
      hostVmId: vmId,
      ...r,
      baseline: r.live && e.phase === 'active',
      valuesNs: e.tNs,
      vcpus: e.vcpus.map((v) => ({ ...v })),
      vpkgs: e.accJ.map((a) => ({ energyJ: a, energyUj: BigInt(microjoules(a)), counter: BigInt(counterOfJoules(a, u)) })),
    };
  });
  const threads: SampledThread[] = [];
  const seen = new Set<number>();
  for (const e of engine.vms) {
    if (e.phase !== 'active') continue;
    for (const m of e.prev) {
      if (seen.has(m.tid)) continue;
      seen.add(m.tid);
      threads.push({ pid: e.pid, tid: m.tid, starttime: m.starttime, ticks: BigInt(m.ticks) });
    }
  }
  const last = engine.lastSample;
  const out: StateSnapshot = {
    nextHostVmId: engine.nextId,
    vms,
    packages: p.energy
      .state()
      .packages.map((k) => ({ ...k, energyUj: BigInt(microjoules(k.energyJ)), unattributedUj: BigInt(microjoules(k.unattributedJ)) })),
    knownPids: p.discovery?.state() ?? [],
    lastSample:
      last === null
        ? null
        : {
            monotonicNs: last.tNs,
            realtimeNs: realtimeNs ?? 0n,
            packages: last.energy.map((k) => ({ pkg: k.pkg, raw: BigInt(k.raw) })),
            threads,
          },
  };
  const domains = captureDomains(engine, p.energy.state());
  if (domains !== null) out.domains = domains;
  if (p.guestEnergy) out.guest = p.guestEnergy.state();
  const limits = p.powerLimits?.state() ?? [];
  if (limits.length > 0) out.limits = limits;
  return out;
}

/** The other RAPL domains' part of the snapshot, or null when none is read. */
function captureDomains(engine: EngineState, energy: HostEnergyState): DomainsState | null {
  const d: DomainsState = {
    vms: engine.vms.flatMap((v) =>
      (v.domainAccJ ?? []).flatMap((a) => (isOtherDomain(a.domain) ? [{ hostVmId: v.id, domain: a.domain, energyJ: [...a.accJ] }] : [])),
    ),
    packages: (energy.domains ?? []).map((k) => ({ pkg: k.pkg, domain: k.domain, energyJ: k.energyJ, unattributedJ: k.unattributedJ })),
    counters: (engine.lastSample?.domains ?? []).flatMap((k) =>
      isOtherDomain(k.domain) ? [{ pkg: k.pkg, domain: k.domain, raw: BigInt(k.raw) }] : [],
    ),
  };
  return d.vms.length + d.packages.length + d.counters.length === 0 ? null : d;
}

/** `starttime`: field 22 of /proc/<pid>/stat, null when the process does not exist. */
type RestoreProbe = { starttime(pid: number): number | null; nowNs: bigint };

/** What each part starts from, and what was left behind. */
export interface RestorePlan {
  sampling: SamplingState;
  registry: VmRecord[];
  energy: HostEnergyState;
  knownPids: KnownProcessState[];
  /** Live VMs discovery had found, to adopt again. */
  discovered: { hostVmId: number; pid: number; starttime: number }[];
  nextConnId: number;
  /** VMs whose process is gone or is another process now: restored ended, with their totals frozen. */
  ended: { hostVmId: number; pid: number; why: string }[];
  /** Why the last sample is not used (every live VM takes a new baseline), or null. */
  rebaseline: string | null;
}

/** Why `s` cannot be restored on this host now: other packages, a reboot, another guest energy unit; or null. */
function refusal(s: StateSnapshot, host: HostInfo, probe: RestoreProbe): string | null {
  const problem = stateProblem(s);
  if (problem !== null) return problem;
  const hostPkgs = host.packages.map((p) => p.pkg).sort((a, b) => a - b);
  const savedPkgs = s.packages.map((p) => p.pkg).sort((a, b) => a - b);
  const last = s.lastSample;
  const samplePkgs = last?.packages.map((p) => p.pkg) ?? [];
  if (savedPkgs.join() !== hostPkgs.join() || samplePkgs.some((p) => !hostPkgs.includes(p)))
    return `it was saved on a host with packages ${savedPkgs.join(',') || 'none'}, this host has packages ${hostPkgs.join(',')}`;
  if (last !== null && last.monotonicNs > probe.nowNs)
    return `its last sample (${last.monotonicNs} ns) is later than now (${probe.nowNs} ns) on the monotonic clock: the host rebooted since`;
  const guest = host.packages.find((p) => p.pkg === 0) ?? host.packages.find((p) => p.pkg === hostPkgs[0]);
  const u = joulesPerCounterUnit(guest!.powerUnit);
  for (const vm of s.vms) {
    for (let g = 0; g < vm.vpkgs.length; g++) {
      const v = vm.vpkgs[g]!;
      if (BigInt(counterOfJoules(v.energyJ, u)) !== v.counter)
        return `VM ${vm.hostVmId}, virtual package ${g}: counter ${v.counter} does not follow from ${v.energyJ} J at this host's energy unit`;
    }
  }
  return null;
}

/** What each part starts from `s`, or "cannot restore state: why; fix". */
export function planRestore(s: StateSnapshot, host: HostInfo, probe: RestoreProbe): Result<RestorePlan> {
  const refused = refusal(s, host, probe);
  if (refused !== null) return fail(cannot('restore state', refused, RESTORE_FIX));
  const last = s.lastSample;
  const ended: RestorePlan['ended'] = [];
  const vms = s.vms.map((vm) => {
    if (!vm.live) return vm;
    const now = probe.starttime(vm.pid);
    if (now === vm.starttime) return vm;
    const why = now === null ? 'its process is gone' : `pid ${vm.pid} is another process now (starttime ${now}, was ${vm.starttime})`;
    ended.push({ hostVmId: vm.hostVmId, pid: vm.pid, why });
    return { ...vm, live: false, baseline: false };
  });
  const rebaseline =
    last !== null && probe.nowNs - last.monotonicNs > MAX_RESTORE_GAP_NS
      ? `the last sample is ${(probe.nowNs - last.monotonicNs) / 1_000_000n} ms old, over ${MAX_RESTORE_GAP_NS / 1_000_000n} ms (the package counters may have wrapped unseen)`
      : null;
  const useLast = last !== null && rebaseline === null;
  // The last sample's threads by process, once (a filter per VM is VMs x threads: 2 M steps for 500 VMs).
  const threadsOf = new Map<number, SampledThread[]>();
  for (const t of useLast ? last.threads : []) {
    const list = threadsOf.get(t.pid);
    if (list) list.push(t);
    else threadsOf.set(t.pid, [t]);
  }
  // The counters as the engine keeps them (mod each one's range): the engine checks them against its ranges.
  const counterValue = (raw: bigint): number => (raw > BigInt(Number.MAX_SAFE_INTEGER) ? Number.MAX_SAFE_INTEGER : Number(raw));
  const engine: EngineState = {
    nextId: s.nextHostVmId,
    lastSample: useLast ? { tNs: last.monotonicNs, energy: last.packages.map((k) => ({ pkg: k.pkg, raw: counterValue(k.raw) })) } : null,
    vms: vms.map((vm) => engineVmOf(vm, s, useLast ? threadsOf : null)),
  };
  if (engine.lastSample !== null && s.domains && s.domains.counters.length > 0)
    engine.lastSample.domains = s.domains.counters.map((k) => ({ domain: k.domain, pkg: k.pkg, raw: counterValue(k.raw) }));
  const registry: VmRecord[] = vms.map(({ hostVmId, baseline: _b, valuesNs: _v, vcpus: _c, vpkgs: _p, ...vm }) => ({
    vmId: hostVmId,
    ...vm,
    uuid: vm.uuid && Buffer.from(vm.uuid),
  }));
  let nextConnId = 1;
  for (const vm of vms) if (vm.owner !== null) nextConnId = Math.max(nextConnId, vm.owner + 1);
  return ok({
    sampling: { engine, realtimeNs: useLast ? last.realtimeNs : null },
    registry,
    energy: {
      tNs: last?.monotonicNs ?? 0n,
      packages: s.packages.map((k) => ({ pkg: k.pkg, energyJ: k.energyJ, unattributedJ: k.unattributedJ })),
      ...(s.domains && s.domains.packages.length > 0 ? { domains: s.domains.packages.map((k) => ({ ...k })) } : {}),
    },
    knownPids: s.knownPids.map((k) => ({ ...k })),
    discovered: vms.filter((vm) => vm.live && vm.discovered).map((vm) => ({ hostVmId: vm.hostVmId, pid: vm.pid, starttime: vm.starttime })),
    nextConnId,
    ended,
    rebaseline,
  });
}

/** A VM as the engine takes it back. `last`: the last sample's threads by process, when it is used. */
function engineVmOf(vm: VmState, s: StateSnapshot, last: ReadonlyMap<number, SampledThread[]> | null): EngineVmState {
  const phase = !vm.live ? 'ended' : vm.baseline && last !== null ? 'active' : 'pending';
  const e: EngineVmState = {
    id: vm.hostVmId,
    pid: vm.pid,
    starttime: vm.starttime,
    vcpus: vm.vcpus.map((v) => ({ ...v })),
    phase,
    accJ: vm.vpkgs.map((v) => v.energyJ),
    tNs: vm.valuesNs,
    prev: phase === 'active' ? (last?.get(vm.pid) ?? []).map((t) => ({ tid: t.tid, starttime: t.starttime, ticks: Number(t.ticks) })) : [],
  };
  const domainAccJ = s.domains?.vms.filter((d) => d.hostVmId === vm.hostVmId).map((d) => ({ domain: d.domain, accJ: [...d.energyJ] }));
  if (domainAccJ !== undefined && domainAccJ.length > 0) e.domainAccJ = domainAccJ;
  if (vm.name !== null) e.name = vm.name;
  if (!vm.live) e.endedBy = 'exit';
  return e;
}
