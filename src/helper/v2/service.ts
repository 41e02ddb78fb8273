/**
 * The v2 service: the entry point the daemon wires in, and the composition root of its parts. The
 * daemon's server hands it every connection that starts with the v2 magic. The parts, each with one job:
 *   VmRegistry (vm-registry.ts)       who may register and see which VM, and the limits
 *   Clients (clients.ts)              the connections, their viewer and host subscription
 *   requests/ (table.ts, dispatch.ts) one handler per request type
 *   DiscoveredVms (discovered-vms.ts) the /proc scan's VMs admitted, refined, deferred
 *   VmLifecycle (vm-lifecycle.ts)     drop, release, end, ended-discovered retention
 *   HostEnergy (host-energy.ts)       per-package energy and unattributed energy for HOST_UPDATE
 *   FanOut (fan-out.ts)               each sample's UPDATE/HOST_UPDATE frames, the failure notice
 * The wire rules are in docs/protocol.md; the choices where they are silent in docs/protocol-v2.md.
 */
import { RatioEngine } from '../../ratio/attribution.js';
import type { HostInfo } from '../../ratio/types.js';
import { SamplingService, type Engine, type SamplingServiceOptions, type SamplingStats } from '../../sampling/sampling-service.js';
import { VmRegistry, procView, type FdAdmitter } from './vm-registry.js';
import { DEFAULT_V2_LIMITS, type V2Limits } from './limits.js';
import { E, encodeHostUpdate } from '../../protocol/v2/codec.js';
import { peerInGroup } from '../../os/peer.js';
import { V2Connection, type ConnectionHost } from './connection.js';
import { LogLimiter } from '../../logging/log-limiter.js';
import { vmLogLimiter } from './vm-log.js';
import type { V2Handler } from '../server/server.js';
import { DisposableStore } from '../../common/disposable.js';
import type { Discovery } from './discovery.js';
import { hostStats, type HealthSource } from './host-stats.js';
import { ENDED_DISCOVERED_KEPT_SAMPLES, VmLifecycle } from './vm-lifecycle.js';
import { HostEnergy } from './host-energy.js';
import { Clients } from './clients.js';
import { FanOut } from './fan-out.js';
import { StatsFiles } from './stats-files.js';
import { monotonicNs } from '../../sampling/tick-loop.js';
import { runInSlices } from '../../sampling/time-slices.js';
import { DiscoveredVms } from './discovered-vms.js';
import { WholeVms } from './whole-vms.js';
import type { NotWhole } from '../../os/proc-tasks.js';
import { currentUpdate, type VmUpdate } from './vm-update.js';
import { dispatch } from './requests/dispatch.js';
import { HANDLERS } from './requests/table.js';
import type { RequestParts } from './requests/handler.js';
import type { SendWithFds } from './reply.js';
import { fail, ok, type Result } from '../../common/result.js';
import { cannot } from '../../common/errors.js';
import type { StateSnapshot } from '../../state/snapshot.js';
import { capture, planRestore, RESTORE_FIX, RESTORED_REGISTRATION_WAIT_MS, type RestorePlan } from './live-state.js';
import { ENERGY_SOURCE_CODE, type EnergySourceKind } from '../../energy/kinds.js';
import { guestVmOf, type GuestVmView } from '../guest/guest-vm.js';

export type { FdAdmitter, V2Limits, V2Handler, Discovery, HealthSource, SendWithFds };
export { DEFAULT_V2_LIMITS, ENDED_DISCOVERED_KEPT_SAMPLES };

/** The sampling loop's options (engine optional: one is made from `host`), plus v2's own. */
export interface V2ServiceOptions extends Omit<SamplingServiceOptions, 'engine' | 'prepare' | 'inspect'> {
  host: HostInfo;
  /** Which energy source the sampler reads: stated in the host statistics file (absent: not stated). */
  energySource?: EnergySourceKind;
  engine?: Engine;
  procRoot: string;
  limits: V2Limits;
  /** Finds VMs by itself; absent = --no-discovery. */
  discovery?: Discovery;
  /** --observer-group: its members see every VM and may HOST_SUBSCRIBE. */
  observerGid?: number;
  health?: HealthSource;
  /**
   * The daemon's fd budget: a REGISTER whose process's threads would not fit is refused (ERROR 4), a
   * discovered VM that would not fit is not tracked (retried later).
   */
  fds?: FdAdmitter;
  /**
   * Opens what sampling `pid` needs now (ProcTaskReader.read), so the fds a VM takes are taken, and
   * counted, at REGISTER; throws when they cannot be (the REGISTER is refused).
   */
  openPid?: (pid: number) => void;
  /** Whether a pid was not sampled whole at the last sample (ProcTaskReader.notWhole): LIST's NOT_WHOLE. */
  notWhole?: (pid: number) => NotWhole | null;
  /** Do not scan until startDiscovery() (the daemon starts it once privileges are dropped). */
  deferDiscovery?: boolean;
  /** Sends a reply that carries fds in one sendmsg with SCM_RIGHTS (reply.ts; the daemon wires socket-fd-sender.ts). */
  sendWithFds?: SendWithFds;
  /**
   * Live state saved by a previous process (service.snapshot()): every part starts from it, or, when
   * it is refused (another host, a rebooted host, inconsistent values), the service starts fresh and
   * `restored` says why. docs/daemon.md "Restart state".
   */
  restore?: StateSnapshot;
  /**
   * How long a restored registration waits for a connection to take it over (a REGISTER of the same
   * process) before it is released as if its connection had closed; default RESTORED_REGISTRATION_WAIT_MS.
   */
  restoreWaitMs?: number;
  /** --guest-energy exact: a VM's guest energy against its exact energy (statistics files). */
  guest?: (vmId: number) => { guestJ: number; exactJ: number } | undefined;
}

/** What a restore kept aside: VMs restored ended, and why the last sample was not used (or null). */
export type RestoreReport = Pick<RestorePlan, 'ended' | 'rebaseline'>;

export interface V2Service {
  handler: V2Handler;
  /** Disconnects every v2 client (their VMs are unregistered) and stops the loop. */
  close(): Promise<void>;
  readonly stats: SamplingStats;
  /** The sampling loop has a tick pending (false while no registered VM is live). */
  readonly running: boolean;
  readonly connections: number;
  /** Registered VMs (the --max-vms count). */
  readonly vms: number;
  /** Every VM known: registered and discovered, ended ones not yet dropped. */
  readonly knownVms: number;
  /**
   * Starts the /proc scans of a service made with deferDiscovery. Resolves once the first interval
   * with discovery on has run (its scan and its sample, or the sample's failure); at once when
   * discovery is off or the service is closed.
   */
  startDiscovery(): Promise<void>;
  /**
   * The live state as one snapshot (VM ids, names, registrations, per-VM and host totals, discovery,
   * the last sample), for the next process to restore. Taken between samples: a sample runs to its end
   * before anything else runs. Throws when a value breaks the snapshot's rules (encodeState's check).
   */
  snapshot(): StateSnapshot;
  /** null: made without `restore`; otherwise what the restore kept aside, or why it was refused. */
  readonly restored: Result<RestoreReport> | null;
  /** The unit QEMU passes to its guests (package 0's MSR_RAPL_POWER_UNIT). */
  readonly guestPowerUnit: bigint;
  /** The live VM whose process is `pid`, as guest energy needs it (--guest-energy exact). */
  guestVm(pid: number): GuestVmView | undefined;
  /**
   * The helper restarts (docs/daemon.md "Restarts"): every connection gets ERROR RESTARTING (request
   * type 0) and is closed, and its registrations stay, to be saved in the snapshot and taken over by
   * the client's REGISTER after the restart. New connections are closed at once.
   */
  restarting(): void;
  /** Every connection told of the restart is closed (its ERROR sent, or the client gone). */
  readonly drained: boolean;
  /** The restart was called off: registrations of the connections closed by restarting() are released as at a close. */
  restartAborted(): void;
}

/** The message of ERROR RESTARTING. */
export const RESTARTING_MESSAGE = 'the helper restarts: reconnect, and REGISTER the same process again to keep its vm_id and totals';

/**
 * The service, made and, with `restore`, restored: the restored discovered VMs' threads are read
 * again in slices of at most SLICE_BUDGET_MS (hundreds of VMs take hundreds of ms, and the daemon
 * serves QEMU's legacy requests meanwhile: docs/daemon.md "Where the time goes"). Nothing else sees
 * the service until it resolves.
 */
export async function createV2Service(o: V2ServiceOptions): Promise<V2Service> {
  const engine = o.engine ?? new RatioEngine(o.host);
  const proc = procView(o.procRoot);
  const registry = new VmRegistry(o.limits, proc, o.fds);
  let closed = false;

  const sampling: SamplingService = new SamplingService({
    engine,
    sampler: o.sampler,
    intervalMs: o.intervalMs,
    trace: o.trace,
    forgetPid: o.forgetPid,
    log: o.log,
    clock: o.clock,
    // Called only once the service is made: `discovered` is set by then.
    ...(o.discovery ? { prepare: () => discovered?.scanInSlices(() => closed || restarting), inspect: (s) => discovered?.refine(s) } : {}),
  });
  // A saved state: the engine first (it refuses inconsistent values before changing anything), then
  // every other part starts from the plan; a refusal anywhere leaves every part fresh.
  let restored: Result<RestoreReport> | null = null;
  let from: RestorePlan | null = null;
  if (o.restore !== undefined) {
    const plan = planRestore(o.restore, o.host, { starttime: (pid) => proc.starttime(pid), nowNs: (o.clock ?? monotonicNs)() });
    if (plan.ok) {
      try {
        sampling.restore(plan.value.sampling);
        from = plan.value;
        restored = ok({ ended: from.ended, rebaseline: from.rebaseline });
      } catch (e) {
        restored = fail(cannot('restore state', (e as Error).message, RESTORE_FIX));
      }
    } else {
      restored = plan;
    }
    if (!restored.ok) o.log.warn({ err: restored.error }, 'saved state not restored: starting fresh');
  }
  if (from !== null) registry.restore(from.registry);
  const clients = new Clients<V2Connection>((on) => sampling.hold('host subscriber', on), from?.nextConnId ?? 1);
  const fanOut = new FanOut(clients);
  const energy = new HostEnergy(
    o.host.packages.map((p) => p.package),
    from?.energy,
    o.host.domains,
  );
  const lastUpdate = (vmId: number, last: VmUpdate) => {
    fanOut.dropped(vmId, last);
    stats.dropped(vmId);
  };
  const vmLog = vmLogLimiter(o.log);
  const lifecycle = new VmLifecycle({ registry, sampling, discovery: o.discovery, lastUpdate, vmLog });
  const limiter = new LogLimiter(o.log);
  const discovered: DiscoveredVms | undefined = o.discovery
    ? new DiscoveredVms({
        discovery: o.discovery,
        registry,
        sampling,
        fds: o.fds,
        log: o.log,
        vmLog,
        ...(o.openPid ? { openPid: o.openPid } : {}),
        changed: () => lifecycle.markChanged(),
      })
    : undefined;
  const whole = o.notWhole ? new WholeVms({ registry, notWhole: o.notWhole, limiter, changed: () => lifecycle.markChanged() }) : undefined;

  let waitTimer: NodeJS.Timeout | undefined;
  if (from !== null) {
    if (o.discovery) {
      o.discovery.restore(from.knownPids);
      const savedVcpus = new Map(from.sampling.engine.vms.map((v) => [v.id, JSON.stringify(v.vcpus)]));
      const discovery = o.discovery;
      // Each VM's threads are read again (a few reads a thread): in slices, clients served between.
      await runInSlices(from.discovered.values(), (d) => {
        if (!discovery.adopt(d.pid, d.starttime)) {
          o.log.warn({ pid: d.pid }, 'restored discovered VM is not a VM discovery recognises now; kept as saved');
          return;
        }
        // vCPU threads born, renamed or gone during the restart: the list as classified now (a registrant's stands).
        const r = registry.get(d.hostVmId);
        const c = discovery.current(d.pid);
        if (r === undefined || r.owner !== null || c === null) return;
        if (JSON.stringify(c.vcpus) !== savedVcpus.get(d.hostVmId)) {
          sampling.updateVcpus(d.hostVmId, c.vcpus);
          lifecycle.markChanged();
        }
        r.wholeVmOnly = c.wholeVmOnly;
      });
    }
    for (const e of from.ended)
      o.log.warn({ vmId: e.hostVmId, pid: e.pid, why: e.why }, 'restored VM ended: its process did not survive the restart');
    if (from.rebaseline !== null) o.log.warn({ why: from.rebaseline }, 'restored totals kept, the restart gap is not attributed');
    if (from.ended.length > 0) lifecycle.markChanged();
    // Registrations whose connection did not come back are released as a closed connection's are.
    if (registry.awaitingConnection().length > 0) {
      waitTimer = setTimeout(() => {
        for (const vmId of registry.awaitingConnection()) lifecycle.release(vmId);
      }, o.restoreWaitMs ?? RESTORED_REGISTRATION_WAIT_MS);
      waitTimer.unref();
    }
    o.log.info({ vms: registry.total, registered: registry.size, awaiting: registry.awaitingConnection().length }, 'live state restored');
    // Every part restored: the first sample closes the interval from the old process's last.
    sampling.resume();
  }

  const hostValues = (changed: boolean, perPackage: boolean, domains = false) =>
    energy.values(changed, perPackage, hostStats(o.health, sampling.stats, clients.size, registry.total), domains);

  const stats = new StatsFiles({
    registry,
    sampling,
    intervalNs: BigInt(Math.round(o.intervalMs * 1e6)),
    clkTck: o.host.clkTck,
    hostValues: () => hostValues(false, true),
    hostDomains: () => energy.domainsUj(),
    ...(o.fds ? { fds: o.fds } : {}),
    log: o.log,
    clock: o.clock ?? monotonicNs,
    ...(o.energySource !== undefined ? { energySourceCode: ENERGY_SOURCE_CODE[o.energySource] } : {}),
    ...(o.guest ? { guest: o.guest } : {}),
    capacity: () => ({
      registered: { used: registry.size, max: o.limits.maxVms },
      discovered: o.discovery ? { used: o.discovery.trackedVms, max: o.discovery.maxVms } : null,
      fds: o.fds?.usage?.() ?? null,
    }),
  });

  const parts: RequestParts = {
    registry,
    sampling,
    lifecycle,
    clients,
    hostValues: (perPackage, domains) => hostValues(false, perPackage, domains),
    openPid: o.openPid,
    forgetPid: o.forgetPid,
    observerGid: o.observerGid,
    stats,
    ...(o.guest ? { guest: o.guest } : {}),
  };

  const startDiscovery = (): Promise<void> => {
    if (!o.discovery || closed) return Promise.resolve();
    const firstInterval = new Promise<void>((resolve) => {
      const done = () => {
        sampled.dispose();
        failed.dispose();
        resolve();
      };
      const sampled = sampling.onSample(done);
      const failed = sampling.onFailure(done);
    });
    sampling.hold('discovery', true);
    return firstInterval;
  };
  if (o.deferDiscovery !== true) void startDiscovery();

  /** While restarting: connections closed keep their registrations (the snapshot carries them). */
  let restarting = false;
  const orphaned: number[] = [];
  const host: ConnectionHost = {
    maxBacklogBytes: o.limits.maxBacklogBytes,
    limiter,
    ...(o.sendWithFds ? { sendWithFds: o.sendWithFds } : {}),
    request: (conn, req) => dispatch(HANDLERS, req, conn, parts),
    closed(conn) {
      clients.remove(conn);
      if (restarting) {
        orphaned.push(conn.id);
        conn.log.debug('v2 connection closed for the restart; its registrations stay');
        return;
      }
      const vms = registry.vmsOf(conn.id);
      for (const vmId of vms) lifecycle.release(vmId);
      conn.log.debug({ vms: vms.length }, 'v2 connection closed');
    },
  };

  const listeners = new DisposableStore();
  listeners.add(
    sampling.onSample((ev) => {
      energy.add(ev.tNs, ev.result?.packages ?? []);
      lifecycle.ended(ev.ended);
      lifecycle.age();
      whole?.check();
      fanOut.sample({
        update: (vmId) => currentUpdate(sampling, vmId),
        host: (perPackage, domains) => encodeHostUpdate(hostValues(lifecycle.changed, perPackage, domains)),
      });
      stats.sample(ev, lifecycle.changed);
      lifecycle.clearChanged();
    }),
  );
  // onFailure fires once per outage (SamplingService.fail), so each subscriber gets one notice.
  listeners.add(sampling.onFailure((err) => fanOut.failed(err)));

  const handler: V2Handler = (socket, peer, rest, hold) => {
    if (closed || restarting) {
      socket.destroy();
      return;
    }
    const conn = new V2Connection(clients.newId(), socket, peer, host, o.log, hold);
    const seesAll = peer.uid === 0 || (o.observerGid !== undefined && peerInGroup(o.procRoot, peer, o.observerGid));
    clients.add(conn, { connId: conn.id, uid: peer.uid, seesAll });
    conn.start(rest);
  };

  return {
    handler,
    async close() {
      closed = true;
      clearTimeout(waitTimer);
      listeners.dispose();
      sampling.close();
      stats.close();
      limiter.flush();
      vmLog.flush();
      const waits = clients.connections().map(
        (c) =>
          new Promise<void>((resolve) => {
            if (c.socket.destroyed) return resolve();
            c.socket.once('close', () => resolve());
            c.destroy();
          }),
      );
      await Promise.all(waits);
    },
    get stats() {
      return sampling.stats;
    },
    get running() {
      return sampling.running;
    },
    get connections() {
      return clients.size;
    },
    get vms() {
      return registry.size;
    },
    get knownVms() {
      return registry.total;
    },
    startDiscovery,
    restarting() {
      restarting = true;
      for (const c of clients.connections()) c.fail(E.RESTARTING, 0, RESTARTING_MESSAGE);
    },
    get drained() {
      return clients.size === 0;
    },
    restartAborted() {
      restarting = false;
      for (const id of orphaned.splice(0)) for (const vmId of registry.vmsOf(id)) lifecycle.release(vmId);
    },
    get guestPowerUnit() {
      return engine.guestPowerUnit;
    },
    guestVm: (pid) => guestVmOf(registry, sampling, pid),
    snapshot: () => capture({ registry, sampling, energy, ...(o.discovery ? { discovery: o.discovery } : {}) }, engine.guestPowerUnit),
    restored,
  };
}
