/**
 * The restore from what the process before kept (docs/daemon.md "Restart state"): the engine takes the plan
 * first (it refuses inconsistent values before changing anything); a refusal anywhere leaves every part fresh.
 */
import type { Logger } from '../../logging/logger.js';
import { cannot } from '../../common/errors.js';
import { fail, ok, type Result } from '../../common/result.js';
import type { HostInfo } from '../../model/host.js';
import type { SamplingService } from '../../sampling/sampling-service.js';
import { runInSlices } from '../../sampling/time-slices.js';
import type { PowerLimitState, StateSnapshot } from '../../state/snapshot.js';
import type { Discovery } from './discovery.js';
import type { GuestEnergy } from '../guest/guest-energy.js';
import type { VmLifecycle } from './vm-lifecycle.js';
import type { VmRegistry } from './vm-registry.js';
import { planRestore, RESTORE_FIX, type RestorePlan } from './live-state.js';

/** How long a restored registration waits for a connection to take it over. */
const RESTORED_REGISTRATION_WAIT_MS = 30_000;

/** What a restore kept aside: VMs restored ended, and why the last sample was not used. */
export type RestoreReport = Pick<RestorePlan, 'ended' | 'rebaseline'>;

/** `snapshot` planned against this host and its processes, and the sampling loop restored from it; plan null: refused. */
function restoreSampling(snapshot: StateSnapshot, o: RestoreFrom<unknown>): { report: Result<RestoreReport>; plan: RestorePlan | null } {
  const planned = planRestore(snapshot, o.host, { starttime: o.starttime, nowNs: o.nowNs });
  let report: Result<RestoreReport> = planned;
  if (planned.ok) {
    try {
      o.sampling.restore(planned.value.sampling);
      report = ok({ ended: planned.value.ended, rebaseline: planned.value.rebaseline });
    } catch (e) {
      report = fail(cannot('restore state', (e as Error).message, RESTORE_FIX));
    }
  }
  if (!report.ok) o.log.warn({ err: report.error }, 'saved state not restored: starting fresh');
  return { report, plan: planned.ok && report.ok ? planned.value : null };
}

/** The service's parts the restore takes back, made from the plan already. */
interface RestoredParts {
  registry: VmRegistry;
  sampling: SamplingService;
  lifecycle: VmLifecycle;
  guestEnergy?: GuestEnergy;
  powerLimits?: { restore(saved: readonly PowerLimitState[]): void } | undefined;
}

interface RestoreFrom<P> {
  host: HostInfo;
  sampling: SamplingService;
  starttime(pid: number): number | null;
  nowNs: bigint;
  log: Logger;
  discovery?: Discovery;
  /** How long a restored registration waits for its connection (default RESTORED_REGISTRATION_WAIT_MS). */
  waitMs?: number;
  /** Makes the service's parts from the plan (null: fresh). */
  build(plan: RestorePlan | null): P;
  /** --guest-energy exact: binds the legacy service's answers to the guest counters; which QEMUs it answered 0 meanwhile. */
  answerGuestEnergy?: (guest: GuestEnergy) => ReadonlyMap<number, bigint>;
}

/** Everything restored from `kept` (undefined: a fresh start; report null); `waiting` releases registrations not taken over. */
export async function restoreFrom<P extends RestoredParts>(
  kept: StateSnapshot | undefined,
  o: RestoreFrom<P>,
): Promise<{ parts: P; report: Result<RestoreReport> | null; waiting: NodeJS.Timeout | undefined }> {
  const r = kept === undefined ? null : restoreSampling(kept, o);
  const parts = o.build(r?.plan ?? null);
  let waiting: NodeJS.Timeout | undefined;
  if (r?.plan) {
    waiting = await restoreParts(r.plan, parts, o);
    parts.powerLimits?.restore(kept?.limits ?? []);
  }
  const guest = parts.guestEnergy;
  if (guest !== undefined && o.answerGuestEnergy !== undefined) guest.restore(kept?.guest ?? [], o.answerGuestEnergy(guest));
  return { parts, report: r?.report ?? null, waiting };
}

/** The rest of the restore, then the loop resumes; returns the timer that releases registrations whose connection did not come back. */
async function restoreParts(plan: RestorePlan, p: RestoredParts, o: RestoreFrom<unknown>): Promise<NodeJS.Timeout | undefined> {
  if (o.discovery) await adoptDiscovered(plan, p, o.discovery, o.log);
  for (const e of plan.ended)
    o.log.warn({ vmId: e.hostVmId, pid: e.pid, why: e.why }, 'restored VM ended: its process did not survive the restart');
  if (plan.rebaseline !== null) o.log.warn({ why: plan.rebaseline }, 'restored totals kept, the restart gap is not attributed');
  if (plan.ended.length > 0) p.lifecycle.changed = true;
  let waitTimer: NodeJS.Timeout | undefined;
  if (p.registry.awaitingConnection().length > 0) {
    waitTimer = setTimeout(() => {
      for (const vmId of p.registry.awaitingConnection()) p.lifecycle.release(vmId);
    }, o.waitMs ?? RESTORED_REGISTRATION_WAIT_MS);
    waitTimer.unref();
  }
  o.log.info(
    { vms: p.registry.total, registered: p.registry.size, awaiting: p.registry.awaitingConnection().length },
    'live state restored',
  );
  p.sampling.resume();
  return waitTimer;
}

/** Discovery takes its processes back; each VM's threads are read again (a few reads a thread), in slices. */
async function adoptDiscovered(plan: RestorePlan, p: RestoredParts, discovery: Discovery, log: Logger): Promise<void> {
  discovery.restore(plan.knownPids);
  const savedVcpus = new Map(plan.sampling.engine.vms.map((v) => [v.id, JSON.stringify(v.vcpus)]));
  await runInSlices(plan.discovered.values(), (d) => {
    if (!discovery.adopt(d.pid, d.starttime)) {
      log.warn({ pid: d.pid }, 'restored discovered VM is not a VM discovery recognises now; kept as saved');
      return;
    }
    // vCPU threads born, renamed or gone during the restart: the list as classified now (a registrant's stands).
    const r = p.registry.get(d.hostVmId);
    const c = discovery.current(d.pid);
    if (r === undefined || r.owner !== null || c === null) return;
    if (JSON.stringify(c.vcpus) !== savedVcpus.get(d.hostVmId)) {
      p.sampling.engine.updateVcpus(d.hostVmId, c.vcpus);
      p.lifecycle.changed = true;
    }
    r.wholeVmOnly = c.wholeVmOnly;
  });
}
