/** The v2 service, owner of its parts (docs/daemon.md "Inside the v2 service"); wire rules: docs/protocol.md, docs/protocol-v2.md. */
import { RatioEngine } from '../../ratio/attribution.js';
import type { HostInfo } from '../../model/host.js';
import { SamplingService, type SampleEvent, type SamplingServiceOptions, type SamplingStats } from '../../sampling/sampling-service.js';
import { settled } from '../../sampling/time-slices.js';
import { VmRegistry, procView, type FdAdmitter } from './vm-registry.js';
import type { V2Limits } from './v2-limits.js';
import { E, encodeHostUpdate } from '../../protocol/v2/codec.js';
import { peerInGroup } from '../../os/peer.js';
import type { PeerCredentials } from '../../os/libc/sockets.js';
import { isPreferredPeer, shareOwnerOf } from '../../budget/preferred-owner.js';
import { V2Connection, type ConnectionHost } from './connection.js';
import { LogLimiter } from '../../logging/log-limiter.js';
import { VM_LOG_BURST } from './vm-log.js';
import type { V2Handler } from '../server/server.js';
import type { Discovery } from './discovery.js';
import { VmLifecycle } from './vm-lifecycle.js';
import { daemonCounters, HostEnergy, type HealthSource } from './host-energy.js';
import { Clients } from './clients.js';
import { FanOut } from './fan-out.js';
import { StatsFiles } from './stats-files.js';
import { monotonicNs, type TickInfo } from '../../sampling/tick-loop.js';
import { DiscoveredVms } from './discovered-vms.js';
import { checkWhole } from './whole-vms.js';
import type { NotWhole } from '../../os/proc-tasks.js';
import { currentUpdate, type VmUpdateFrame } from './vm-update-frame.js';
import { dispatch, HANDLERS } from './requests/table.js';
import type { RequestParts } from './requests/handler.js';
import type { SendWithFds } from './reply.js';
import type { Result } from '../../common/result.js';
import type { StateSnapshot } from '../../state/snapshot.js';
import { capture, type RestorePlan } from './live-state.js';
import { restoreFrom, type RestoreReport } from './restore.js';
import { ENERGY_SOURCE_CODE, type EnergySourceKind } from '../../energy/kinds.js';
import { GuestDirs } from '../../guest-dir/guest-dirs.js';
import { guestSource, guestVmsOf } from './guest-vm.js';
import { GuestEnergy, type GuestEnergyOptions } from '../guest/guest-energy.js';
import { joulesPerCounterUnit } from '../../ratio/counter.js';
import { PowerLimiter } from '../../power-limit/limiter.js';
import { applyLimitsFile, readLimitsFile, type LimitsFile } from '../../power-limit/limits-file.js';
import type { BandwidthOpener } from '../../power-limit/cpu-bandwidth.js';

/** The sampling loop's options (engine optional: one is made from `host`), plus v2's own. */
export interface V2ServiceOptions extends Omit<SamplingServiceOptions, 'engine' | 'interval'> {
  host: HostInfo;
  /** The energy source stated in the host statistics file (absent: not stated). */
  energySource?: EnergySourceKind;
  engine?: RatioEngine;
  procRoot: string;
  limits: V2Limits;
  /** Finds VMs by itself; absent = --no-discovery. */
  discovery?: Discovery;
  /** --observer-group: its members see every VM and may HOST_SUBSCRIBE. */
  observerGid?: number;
  health?: HealthSource;
  /** The daemon's fd budget: a REGISTER that would not fit is refused (ERROR 4), a discovered VM is retried later. */
  fds?: FdAdmitter;
  /** Opens (and counts) the fds sampling `pid` takes, at REGISTER; throws when it cannot (REGISTER refused). */
  openPid?: (pid: number) => void;
  /** Whether a pid was not sampled whole at the last sample (ProcTaskReader.notWhole): LIST's NOT_WHOLE. */
  notWhole?: (pid: number) => NotWhole | null;
  /** Do not scan until startDiscovery() (the daemon starts it once privileges are dropped). */
  deferDiscovery?: boolean;
  /** Sends a reply with fds in one sendmsg with SCM_RIGHTS (assemble.ts). */
  sendWithFds?: SendWithFds;
  /** A previous process's snapshot(); when refused the service starts fresh and `restored` says why (docs/daemon.md "Restart state"). */
  restore?: StateSnapshot;
  /** How long a restored registration waits for a REGISTER of its process; default RESTORED_REGISTRATION_WAIT_MS. */
  restoreWaitMs?: number;
  /** --guest-dir: each VM's powercap-shaped tree and statistics file in DIR/<uuid>/ (docs/guest.md); absent: none. */
  guestDir?: string;
  /** --guest-energy exact (absent: raw); `answer` binds QEMU's requests to it, saying which were answered 0 meanwhile (resynchronised). */
  guestEnergy?: Pick<GuestEnergyOptions, 'maxThreads' | 'log' | 'heldFds' | 'ledger' | 'maxPeers'> & {
    preferredGroups?: readonly number[];
    answer?: (guest: GuestEnergy) => ReadonlyMap<number, bigint>;
  };
  /** Power limits (docs/power-limits.md): each VM's CPU bandwidth, who besides root may set them (--socket-group), --power-limits FILE. */
  powerLimits?: { open: BandwidthOpener; adminGid?: number; file?: string };
}

const RESTARTING_MESSAGE = 'the helper restarts: reconnect, and REGISTER the same process again to keep its vm_id and totals';

/** The service, restored from `restore` in slices (restore.ts; docs/daemon.md "Where the time goes"). */
export async function createV2Service(o: V2ServiceOptions): Promise<V2Service> {
  const engine = o.engine ?? new RatioEngine(o.host);
  const proc = procView(o.procRoot);
  const sampling: SamplingService = new SamplingService({
    ...o,
    engine,
    // Called only once the service is made (a tick comes after it).
    interval: (t) => service.interval(t),
  });
  const { parts, report, waiting } = await restoreFrom(o.restore, {
    host: o.host,
    sampling,
    starttime: (pid) => proc.starttime(pid),
    nowNs: (o.clock ?? monotonicNs)(),
    log: o.log,
    ...(o.discovery ? { discovery: o.discovery } : {}),
    ...(o.restoreWaitMs !== undefined ? { waitMs: o.restoreWaitMs } : {}),
    build: (plan) => makeParts(o, sampling, new VmRegistry(o.limits, proc, o.fds), plan),
    ...(o.guestEnergy?.answer ? { answerGuestEnergy: o.guestEnergy.answer } : {}),
  });
  const service = new V2Service(o, parts, report, waiting);
  service.applyLimitsFile();
  if (o.deferDiscovery !== true) void service.startDiscovery();
  return service;
}

type Parts = ReturnType<typeof makeParts>;

/** Each VM's and the host's statistics files, written once per sample. */
function makeStatsFiles(
  o: V2ServiceOptions,
  p: Pick<Parts, 'registry' | 'sampling' | 'energy' | 'hostValues' | 'guestEnergy' | 'powerLimits'>,
): StatsFiles {
  const { registry, sampling, energy, hostValues, guestEnergy, powerLimits: limits } = p;
  return new StatsFiles({
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
    ...(guestEnergy ? { guest: (vmId: number) => guestEnergy.view(vmId) } : {}),
    ...(limits ? { powerLimit: (vmId: number) => limits.views(vmId) } : {}),
    capacity: () => ({
      registered: { used: registry.size, max: o.limits.maxVms },
      discovered: o.discovery ? { used: o.discovery.trackedVms, max: o.discovery.maxVms } : null,
      fds: o.fds?.usage?.() ?? null,
    }),
  });
}

/** --guest-energy exact, in the engine's energy unit (QEMU passes the host's unit to its guests). */
function exactGuestEnergy(
  o: V2ServiceOptions,
  g: NonNullable<V2ServiceOptions['guestEnergy']>,
  registry: VmRegistry,
  sampling: SamplingService,
): GuestEnergy {
  return new GuestEnergy({
    ...g,
    procRoot: o.procRoot,
    host: o.host,
    unitJ: joulesPerCounterUnit(sampling.engine.guestPowerUnit),
    find: (pid) => guestVmsOf(registry, sampling, new Set([pid])).get(pid),
    findAll: (pids) => guestVmsOf(registry, sampling, pids),
    clock: monotonicNs,
    // The share rule of discovery: root and the socket's group are preferred (budget/uid-share.ts).
    owner: (pid, peer) =>
      peer === undefined
        ? shareOwnerOf(o.procRoot, pid, g.preferredGroups ?? [])
        : { uid: peer.uid, preferred: isPreferredPeer(o.procRoot, peer, g.preferredGroups ?? []) },
  });
}

/** The power limiter on the engine's totals, and LIMIT's rule: root and --socket-group may set limits. */
function powerLimiter(o: V2ServiceOptions, pl: NonNullable<V2ServiceOptions['powerLimits']>, sampling: SamplingService) {
  const limiter = new PowerLimiter({
    open: pl.open,
    log: o.log,
    clkTck: o.host.clkTck,
    totalsInto: (vmId, into) => sampling.engine.totalsInto(vmId, into),
    domains: ['package', ...new Set((o.host.domains ?? []).map((c) => c.domain))],
  });
  const mayLimit = (peer: PeerCredentials) => peer.uid === 0 || (pl.adminGid !== undefined && peerInGroup(o.procRoot, peer, pl.adminGid));
  return { limiter, mayLimit };
}

/** Each part once, from the restore plan when there is one. */
function makeParts(o: V2ServiceOptions, sampling: SamplingService, registry: VmRegistry, from: RestorePlan | null) {
  if (from !== null) registry.restore(from.registry);
  const clients = new Clients<V2Connection>((on) => sampling.hold('host subscriber', on), from?.nextConnId ?? 1);
  const fanOut = new FanOut(clients);
  const energy = new HostEnergy(
    o.host.packages.map((p) => p.pkg),
    from?.energy,
    o.host.domains,
  );
  const limits = o.powerLimits && powerLimiter(o, o.powerLimits, sampling);
  const limitsFile: LimitsFile | undefined =
    o.powerLimits?.file === undefined ? undefined : readLimitsFile(o.powerLimits.file, (d) => limits!.limiter.domainProblem(d));
  for (const p of limitsFile?.problems ?? []) o.log.warn({ powerLimits: o.powerLimits?.file }, p);
  const lastUpdate = (vmId: number, last: VmUpdateFrame) => {
    fanOut.dropped(vmId, last);
    stats.dropped(vmId);
    limits?.limiter.forget(vmId);
  };
  const vmLog = new LogLimiter(o.log, VM_LOG_BURST);
  const lifecycle = new VmLifecycle({ registry, sampling, discovery: o.discovery, lastUpdate, vmLog });
  const limiter = new LogLimiter(o.log);
  const changed = () => (lifecycle.changed = true);
  const discovered =
    o.discovery && new DiscoveredVms({ discovery: o.discovery, registry, sampling, fds: o.fds, vmLog, openPid: o.openPid, changed });
  const notWhole = o.notWhole;
  const whole = notWhole && (() => checkWhole({ registry, notWhole, limiter, changed }));
  const hostValues = (changed: boolean, perPackage: boolean, domains = false) =>
    energy.values(changed, perPackage, daemonCounters(o.health, sampling.stats, clients.size, registry.total), domains);
  const guestEnergy = o.guestEnergy && exactGuestEnergy(o, o.guestEnergy, registry, sampling);
  const stats = makeStatsFiles(o, { registry, sampling, energy, hostValues, guestEnergy, powerLimits: limits?.limiter });
  const guests =
    o.guestDir === undefined
      ? undefined
      : new GuestDirs(o.guestDir, guestSource({ registry, stats, fds: o.fds, procRoot: o.procRoot, observerGid: o.observerGid }), o.log);
  const requests: RequestParts = {
    registry,
    sampling,
    lifecycle,
    clients,
    hostValues: (perPackage, domains) => hostValues(false, perPackage, domains),
    openPid: o.openPid,
    forgetPid: o.forgetPid,
    observerGid: o.observerGid,
    stats,
    guest: guestEnergy && ((vmId: number) => guestEnergy.view(vmId)),
    limits,
  };
  return {
    registry,
    sampling,
    clients,
    fanOut,
    energy,
    lifecycle,
    discovered,
    whole,
    stats,
    guests,
    guestEnergy,
    powerLimits: limits?.limiter,
    limitsFile,
    requests,
    hostValues,
    limiter,
    vmLog,
  };
}

/** The v2 service: its connections, its parts, the per-sample flow, and freeze()/snapshot() for a restart. */
export class V2Service {
  private closed = false;
  /** Connections closed while restarting keep their registrations (the snapshot carries them). */
  private restarting = false;
  private readonly orphaned: number[] = [];
  /** Where the live state goes after each sample (checkpointTo); null: nowhere. */
  private checkpoint: ((state: StateSnapshot | Error) => void) | null = null;
  /** startDiscovery()'s waits for the end of an interval. */
  private readonly intervalWaits: (() => void)[] = [];
  private readonly connectionHost: ConnectionHost;

  constructor(
    private readonly o: V2ServiceOptions,
    private readonly p: ReturnType<typeof makeParts>,
    /** null: made without `restore`; otherwise what the restore kept aside, or why it was refused. */
    readonly restored: Result<RestoreReport> | null,
    /** The release of restored registrations still waiting for their connection. */
    private readonly restoredWait?: NodeJS.Timeout,
  ) {
    this.connectionHost = {
      maxBacklogBytes: o.limits.maxBacklogBytes,
      limiter: p.limiter,
      ...(o.sendWithFds ? { sendWithFds: o.sendWithFds } : {}),
      request: (conn, req) => dispatch(HANDLERS, req, conn, p.requests),
      closed: (conn) => this.connectionClosed(conn),
    };
  }

  /** Takes every connection that starts with the v2 magic. */
  readonly handler: V2Handler = (socket, peer, rest, hold) => {
    if (this.closed || this.restarting) {
      socket.destroy();
      return;
    }
    const o = this.o;
    const conn = new V2Connection(this.p.clients.newId(), socket, peer, this.connectionHost, o.log, hold);
    const seesAll = peer.uid === 0 || (o.observerGid !== undefined && peerInGroup(o.procRoot, peer, o.observerGid));
    this.p.clients.add(conn, { connId: conn.id, uid: peer.uid, seesAll });
    conn.start(rest);
  };

  /** One interval, every step in order (docs/architecture.md "Following a sample"). */
  interval(t: TickInfo): void {
    const { sampling, discovered, fanOut } = this.p;
    if (!sampling.begin()) return;
    const failedBefore = sampling.failed;
    const scan = discovered
      ?.scanInSlices(() => this.closed || this.restarting)
      .catch((e: unknown) => {
        this.o.log.error({ err: (e as Error).stack ?? String(e) }, 'sampling preparation (discovery) failed; sampling goes on');
      });
    settled(scan, () =>
      settled(sampling.take(t), (s) => {
        try {
          if (s === undefined || this.closed) return;
          discovered?.refine(s);
          const ev = sampling.attribute(s);
          if (ev === null) return;
          sampling.trace(s);
          this.consume(ev);
        } catch (e) {
          // Only the refine throws (the engine and the consumers catch their own): the sample failed.
          sampling.fail(e);
        } finally {
          sampling.end();
          // A new outage: each subscriber gets one notice (failed stays the same error while it lasts).
          if (sampling.failed !== null && sampling.failed !== failedBefore) fanOut.failed(sampling.failed);
          for (const done of this.intervalWaits.splice(0)) done();
        }
      }),
    );
  }

  /** The consumers of a sample, in order: the checkpoint before the fan-out (a crash restores nothing older than what a client was told). */
  private consume(ev: SampleEvent): void {
    const { energy, lifecycle, whole, fanOut, stats, guests, sampling, guestEnergy } = this.p;
    try {
      energy.add(ev.tNs, ev.result?.packages ?? []);
      lifecycle.ended(ev.ended);
      lifecycle.age();
      whole?.();
      if (lifecycle.changed) this.applyLimitsFile();
      this.p.powerLimits?.sample(ev.result, ev.ended);
      this.checkpoint?.(this.liveState());
      fanOut.sample({
        update: (vmId) => currentUpdate(sampling.engine, vmId),
        host: (perPackage, domains) => encodeHostUpdate(this.p.hostValues(lifecycle.changed, perPackage, domains)),
      });
      stats.sample(ev, lifecycle.changed);
      guests?.sample();
      guestEnergy?.sampled();
      lifecycle.changed = false;
    } catch (e) {
      this.o.log.error({ err: (e as Error).message }, 'sample listener failed');
    }
  }

  /** --power-limits FILE's limits on the live VMs (at the start, and when VMs come or change). */
  applyLimitsFile(): void {
    if (this.p.limitsFile && this.p.powerLimits) applyLimitsFile(this.p.limitsFile, this.p.registry.all(), this.p.powerLimits);
  }

  private connectionClosed(conn: V2Connection): void {
    this.p.clients.remove(conn);
    if (this.restarting) {
      this.orphaned.push(conn.id);
      conn.log.debug('v2 connection closed for the restart; its registrations stay');
      return;
    }
    const vms = this.p.registry.vmsOf(conn.id);
    for (const vmId of vms) this.p.lifecycle.release(vmId);
    conn.log.debug({ vms: vms.length }, 'v2 connection closed');
  }

  /** Starts the /proc scans (deferDiscovery); resolves once the first interval with discovery has run. */
  startDiscovery(): Promise<void> {
    if (!this.o.discovery || this.closed) return Promise.resolve();
    const firstInterval = new Promise<void>((resolve) => this.intervalWaits.push(resolve));
    this.p.sampling.hold('discovery', true);
    return firstInterval;
  }

  /**
   * A restart (docs/daemon.md "Restarts"): every connection gets ERROR RESTARTING and is closed, its
   * registrations kept for the snapshot. `drained`: every connection told is closed; `thaw()`: the
   * restart was called off, those registrations are released as at a close.
   */
  freeze(): { readonly drained: boolean; thaw(): void } {
    this.restarting = true;
    for (const c of this.p.clients.connections()) c.fail(E.RESTARTING, 0, RESTARTING_MESSAGE);
    const clients = this.p.clients;
    return {
      get drained() {
        return clients.size === 0;
      },
      thaw: () => {
        this.restarting = false;
        for (const id of this.orphaned.splice(0)) for (const vmId of this.p.registry.vmsOf(id)) this.p.lifecycle.release(vmId);
      },
    };
  }

  /** The live state for the next process, taken between samples; throws when a value breaks the snapshot's rules. */
  snapshot(): StateSnapshot {
    return capture({ ...this.p, discovery: this.o.discovery });
  }

  /** `to` (the crash keep) gets the live state, or why not, now and after every sample before any client is told. */
  checkpointTo(to: ((state: StateSnapshot | Error) => void) | null): void {
    this.checkpoint = to;
    to?.(this.liveState());
  }

  /** snapshot(), or why it cannot be taken. */
  private liveState(): StateSnapshot | Error {
    try {
      return this.snapshot();
    } catch (e) {
      return e instanceof Error ? e : new Error(String(e));
    }
  }

  /** Disconnects every v2 client (their VMs are unregistered) and stops the loop. */
  async close(): Promise<void> {
    const p = this.p;
    this.closed = true;
    clearTimeout(this.restoredWait);
    p.sampling.close();
    p.powerLimits?.close();
    p.guests?.close();
    p.stats.close();
    p.limiter.flush();
    p.vmLog.flush();
    const waits = p.clients.connections().map(
      (c) =>
        new Promise<void>((resolve) => {
          if (c.socket.destroyed) return resolve();
          c.socket.once('close', () => resolve());
          c.destroy();
        }),
    );
    await Promise.all(waits);
  }

  /** The loop's counters (the benches read its lateness). */
  get stats(): SamplingStats {
    return this.p.sampling.stats;
  }
}
