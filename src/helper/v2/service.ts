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
import { DEFAULT_V2_LIMITS, VmRegistry, procView, type FdAdmitter, type V2Limits } from './vm-registry.js';
import { encodeHostUpdate } from '../../protocol/v2/codec.js';
import { peerInGroup } from '../../os/peer.js';
import { V2Connection, type ConnectionHost } from './connection.js';
import { LogLimiter } from '../../logging/log-limiter.js';
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
import { DiscoveredVms } from './discovered-vms.js';
import { currentUpdate } from './vm-update.js';
import { dispatch } from './requests/dispatch.js';
import { HANDLERS } from './requests/table.js';
import type { RequestParts } from './requests/handler.js';
import type { SendWithFds } from './reply.js';

export type { FdAdmitter, V2Limits, V2Handler, Discovery, HealthSource, SendWithFds };
export { DEFAULT_V2_LIMITS, ENDED_DISCOVERED_KEPT_SAMPLES };

/** The sampling loop's options (engine optional: one is made from `host`), plus v2's own. */
export interface V2ServiceOptions extends Omit<SamplingServiceOptions, 'engine' | 'prepare' | 'inspect'> {
  host: HostInfo;
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
  /** Do not scan until startDiscovery() (the daemon starts it once privileges are dropped). */
  deferDiscovery?: boolean;
  /** Sends a reply that carries fds in one sendmsg with SCM_RIGHTS (reply.ts; the daemon wires socket-fd-sender.ts). */
  sendWithFds?: SendWithFds;
}

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
}

export function createV2Service(o: V2ServiceOptions): V2Service {
  const engine = o.engine ?? new RatioEngine(o.host);
  const registry = new VmRegistry(o.limits, procView(o.procRoot), o.fds);
  const clients = new Clients<V2Connection>((on) => sampling.hold('host subscriber', on));
  const fanOut = new FanOut(clients);
  const energy = new HostEnergy(o.host.packages.map((p) => p.package));
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
    ...(o.discovery ? { prepare: () => discovered?.scan(), inspect: (s) => discovered?.refine(s) } : {}),
  });
  const lastUpdate = (vmId: number, frame: Buffer) => {
    fanOut.dropped(vmId, frame);
    stats.dropped(vmId);
  };
  const lifecycle = new VmLifecycle({ registry, sampling, discovery: o.discovery, lastUpdate });
  const discovered: DiscoveredVms | undefined = o.discovery
    ? new DiscoveredVms({ discovery: o.discovery, registry, sampling, fds: o.fds, log: o.log, changed: () => lifecycle.markChanged() })
    : undefined;

  const hostValues = (changed: boolean, perPackage: boolean) =>
    energy.values(changed, perPackage, hostStats(o.health, sampling.stats, clients.size, registry.total));

  const stats = new StatsFiles({
    registry,
    sampling,
    intervalNs: BigInt(Math.round(o.intervalMs * 1e6)),
    clkTck: o.host.clkTck,
    hostValues: () => hostValues(false, true),
    ...(o.fds ? { fds: o.fds } : {}),
    log: o.log,
    clock: o.clock ?? monotonicNs,
  });

  const parts: RequestParts = {
    registry,
    sampling,
    lifecycle,
    clients,
    hostValues: (perPackage) => hostValues(false, perPackage),
    openPid: o.openPid,
    forgetPid: o.forgetPid,
    observerGid: o.observerGid,
    stats,
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

  const limiter = new LogLimiter(o.log);
  const host: ConnectionHost = {
    maxBacklogBytes: o.limits.maxBacklogBytes,
    limiter,
    ...(o.sendWithFds ? { sendWithFds: o.sendWithFds } : {}),
    request: (conn, req) => dispatch(HANDLERS, req, conn, parts),
    closed(conn) {
      clients.remove(conn);
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
      fanOut.sample({
        update: (vmId) => currentUpdate(sampling, vmId),
        host: (perPackage) => encodeHostUpdate(hostValues(lifecycle.changed, perPackage)),
      });
      stats.sample(ev, lifecycle.changed);
      lifecycle.clearChanged();
    }),
  );
  // onFailure fires once per outage (SamplingService.fail), so each subscriber gets one notice.
  listeners.add(sampling.onFailure((err) => fanOut.failed(err)));

  const handler: V2Handler = (socket, peer, rest, hold) => {
    if (closed) {
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
      listeners.dispose();
      sampling.close();
      stats.close();
      limiter.flush();
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
  };
}
