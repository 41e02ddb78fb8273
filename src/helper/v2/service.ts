/**
 * The v2 service: the entry point the daemon wires in. It owns the VM registry, the sampling loop and
 * the connections; the daemon's server hands it every connection that starts with the v2 magic.
 * The wire rules are in docs/protocol.md; the choices where they are silent in docs/protocol-v2.md.
 */
import { RatioEngine } from '../../ratio/attribution.js';
import type { HostInfo } from '../../ratio/types.js';
import { SamplingService, type Engine, type SamplingServiceOptions, type SamplingStats } from '../../sampling/sampling-service.js';
import { DEFAULT_V2_LIMITS, VmRegistry, procView, type FdAdmitter, type RefusalReason, type V2Limits, type VmRecord, type Viewer } from './vm-registry.js';
import { E, T, encodeError, encodeHostUpdate, encodeOk, encodeRegistered, encodeUpdate, encodeValue, encodeVmList, type HostValues, type VmEntry } from '../../protocol/v2/codec.js';
import type { DiscoveredVm } from '../../discovery/scanner.js';
import type { VcpuSpec } from '../../ratio/types.js';
import { peerInGroup } from '../../os/peer.js';
import { V2Connection, type ConnectionHost } from './connection.js';
import type { ClientRequest } from '../../protocol/v2/messages.js';
import { LogLimiter } from '../../logging/log-limiter.js';
import type { V2Handler } from '../server/server.js';
import { DisposableStore } from '../../common/disposable.js';
import type { LegacyCounters } from '../legacy/legacy-service.js';
import { cannot } from '../../common/errors.js';

export type { FdAdmitter, V2Limits, V2Handler };
export { DEFAULT_V2_LIMITS };

/** What the v2 service needs from discovery (ProcScanner implements it). */
export interface Discovery {
  /** VM processes that appeared since the last scan. */
  scan(): DiscoveredVm[];
  /** New vCPU list of a discovered VM from this sample's stat lines, null when unchanged. */
  refine(pid: number, lines: ReadonlyMap<number, string>): { vcpus: VcpuSpec[]; wholeVmOnly: boolean } | null;
  /** The VM of this pid ended or was dropped: examine the pid afresh. */
  forget(pid: number): void;
  /** The vCPU list as last classified (a registrant let go of a discovered VM). */
  current(pid: number): { vcpus: VcpuSpec[]; wholeVmOnly: boolean } | null;
  /** A VM scan() returned that was not admitted: try it again later. */
  defer(pid: number): void;
}


/** Daemon-wide health counters HOST_UPDATE carries (legacy requests, connections). */
export interface HealthSource {
  legacy: LegacyCounters;
  connections(): number;
}

/** Samples an ended discovered VM stays listed (ENDED) before it is dropped. */
export const ENDED_DISCOVERED_KEPT_SAMPLES = 5;

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

/** The wire code of each registry refusal (docs/protocol-v2.md, REGISTER). */
const REFUSAL_CODE: Readonly<Record<RefusalReason, number>> = {
  limit: E.LIMIT,
  'not-permitted': E.NOT_PERMITTED,
  'process-gone': E.PROCESS_GONE,
};

export function createV2Service(o: V2ServiceOptions): V2Service {
  const engine = o.engine ?? new RatioEngine(o.host);
  const registry = new VmRegistry(o.limits, procView(o.procRoot), o.fds);
  const conns = new Set<V2Connection>();
  const viewers = new Map<V2Connection, Viewer>();
  /** Host subscribers, each with whether it asked for per-package unattributed energy. */
  const hostSubs = new Map<V2Connection, boolean>();
  let nextConnId = 1;
  let closed = false;
  /** A VM appeared, ended or was dropped since the last HOST_UPDATE. */
  let vmsChanged = false;
  /** Per host package since sampling started: its energy, and the part of it attributed to no VM (J). */
  const pkgJ = new Map<number, { energyJ: number; unattributedJ: number }>(o.host.packages.map((p) => [p.package, { energyJ: 0, unattributedJ: 0 }]));
  let lastSampleNs = 0n;

  /** pids of VMs not admitted, so the warning is logged once per VM. */
  const deferred = new Set<number>();
  const discover = (d: DiscoveredVm) => {
    const reg = registry.registrationOf(d.pid, d.starttime);
    const meta = { name: d.name, uuid: d.uuid, wholeVmOnly: d.wholeVmOnly };
    if (reg !== undefined) {
      // One process, one VM: the registration keeps its vCPU list; LIST gains the name and UUID.
      registry.addDiscovered(reg.vmId, d.pid, d.starttime, d.uid, meta);
      return;
    }
    const fit = o.fds?.canAdmit(d.threads);
    if (fit && !fit.ok) {
      o.discovery?.defer(d.pid);
      if (!deferred.has(d.pid)) o.log.warn({ pid: d.pid, name: d.name, err: fit.error }, 'VM discovered but not sampled');
      deferred.add(d.pid);
      return;
    }
    deferred.delete(d.pid);
    const spec = { pid: d.pid, starttime: d.starttime, vcpus: d.vcpus, ...(d.name !== null ? { name: d.name } : {}) };
    const vmId = sampling.register(spec);
    registry.addDiscovered(vmId, d.pid, d.starttime, d.uid, meta);
    vmsChanged = true;
    o.log.info({ vmId, pid: d.pid, uid: d.uid, name: d.name, vcpus: d.vcpus.length, nvpkg: sampling.nvpkg(vmId), wholeVmOnly: d.wholeVmOnly, problems: d.problems }, 'VM discovered');
  };

  const discovered = (): VmRecord[] => {
    const out: VmRecord[] = [];
    for (const r of registry.all()) if (r.discovered && r.live) out.push(r);
    return out;
  };

  const sampling = new SamplingService({
    engine,
    sampler: o.sampler,
    intervalMs: o.intervalMs,
    trace: o.trace,
    forgetPid: o.forgetPid,
    log: o.log,
    clock: o.clock,
    ...(o.discovery
      ? {
          prepare: () => {
            for (const d of o.discovery!.scan()) discover(d);
          },
          inspect: (s) => {
            for (const r of discovered()) {
              const lines = s.tasks.get(r.pid);
              if (lines === undefined) continue;
              const c = o.discovery!.refine(r.pid, lines);
              // A registrant's vCPU list stands while it holds the VM.
              if (c === null || r.owner !== null) continue;
              sampling.updateVcpus(r.vmId, c.vcpus);
              if (r.wholeVmOnly !== c.wholeVmOnly) vmsChanged = true;
              r.wholeVmOnly = c.wholeVmOnly;
            }
          },
        }
      : {}),
  });

  /** Drops a VM; whoever still watches it gets a last UPDATE with ENDED. */
  const dropVm = (vmId: number) => {
    const out = sampling.output(vmId);
    if (out) {
      const frame = encodeUpdate(vmId, out.tNs, out.vpkgs.map((v) => ({ counter: BigInt(v.counter), energyUj: v.energyUj })), true);
      for (const c of conns) if (c.subscriptions.delete(vmId)) c.send(frame);
    }
    const r = registry.get(vmId);
    sampling.unregister(vmId);
    registry.remove(vmId);
    if (r?.discovered && r.live) o.discovery?.forget(r.pid);
    vmsChanged = true;
  };

  /** A registrant lets go: a live discovered VM goes on (its vCPUs from thread names again), any other is dropped. */
  const releaseVm = (vmId: number) => {
    const r = registry.get(vmId);
    if (r && registry.release(vmId)) {
      const c = o.discovery?.current(r.pid);
      if (c) {
        sampling.updateVcpus(vmId, c.vcpus);
        r.wholeVmOnly = c.wholeVmOnly;
      }
      vmsChanged = true;
      return;
    }
    dropVm(vmId);
  };

  const entryOf = (r: VmRecord): VmEntry => ({
    hostVmId: r.vmId,
    pid: r.pid,
    uid: r.uid,
    nvpkg: sampling.nvpkg(r.vmId),
    starttime: BigInt(r.starttime),
    ended: !r.live,
    discovered: r.owner === null,
    wholeVmOnly: r.wholeVmOnly,
    name: r.name,
    uuid: r.uuid,
  });

  const uj = (j: number) => BigInt(Math.floor(j * 1e6));
  const hostValues = (changed: boolean, perPackage: boolean): HostValues => {
    const h = o.health;
    const st = sampling.stats;
    let unattributedJ = 0;
    for (const k of pkgJ.values()) unattributedJ += k.unattributedJ;
    return {
      tNs: lastSampleNs,
      packages: [...pkgJ].map(([pkg, k]) => ({ pkg, energyUj: uj(k.energyJ), unattributedUj: perPackage ? uj(k.unattributedJ) : null })),
      unattributedUj: uj(unattributedJ),
      vmsChanged: changed,
      stats: {
        legacyOk: BigInt(h?.legacy.ok ?? 0),
        legacyRefused: BigInt(h?.legacy.refused ?? 0),
        legacyFailed: BigInt(h?.legacy.failed ?? 0),
        lastSampleDurationNs: st.lastDurationNs,
        samples: BigInt(st.samples),
        sampleFailures: BigInt(st.failures),
        connections: h ? h.connections() : conns.size,
        vms: registry.total,
      },
    };
  };

  const updateFrame = (vmId: number): { frame: Buffer; ended: boolean } | null => {
    const out = sampling.output(vmId);
    if (!out) return null;
    const values = out.vpkgs.map((v) => ({ counter: BigInt(v.counter), energyUj: v.energyUj }));
    return { frame: encodeUpdate(vmId, out.tNs, values, out.ended), ended: out.ended };
  };

  const viewerOf = (conn: V2Connection): Viewer => viewers.get(conn) ?? { connId: conn.id, uid: conn.peer.uid, seesAll: false };
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

  const request = (conn: V2Connection, req: ClientRequest): Buffer => {
    switch (req.type) {
      case T.REGISTER: {
        const a = registry.admit(conn.id, conn.peer, req);
        if (!a.ok) return encodeError(REFUSAL_CODE[a.error.reason], T.REGISTER, a.error.message);
        const { spec, uid, attachTo } = a.value;
        let vmId: number;
        if (attachTo !== undefined) {
          // The discovered VM of this very process: one VM, its energy goes on; the client's vCPU list now stands.
          vmId = attachTo;
          sampling.updateVcpus(vmId, spec.vcpus);
        } else {
          try {
            o.openPid?.(spec.pid);
          } catch (e) {
            o.forgetPid?.(spec.pid);
            return encodeError(E.LIMIT, T.REGISTER, cannot(`register process ${spec.pid}`, (e as Error).message));
          }
          vmId = sampling.register(spec);
        }
        registry.add(conn.id, vmId, spec, uid);
        vmsChanged = true;
        conn.log.info({ vmId, pid: spec.pid, vcpus: spec.vcpus.length, wasDiscovered: attachTo !== undefined }, 'v2 VM registered');
        return encodeRegistered(vmId, sampling.nvpkg(vmId), sampling.guestPowerUnit);
      }
      case T.READ: {
        if (!registry.owns(conn.id, req.vmId)) return encodeError(E.NO_SUCH, T.READ, `no VM ${req.vmId} on this connection`);
        const out = sampling.output(req.vmId);
        const v = out?.vpkgs[req.vpkg];
        if (!out || !v) return encodeError(E.NO_SUCH, T.READ, `VM ${req.vmId} has no virtual package ${req.vpkg} (it has ${out?.vpkgs.length ?? 0})`);
        if (sampling.failed && !out.ended) return encodeError(E.ENERGY_SOURCE, T.READ, `sampling failed: ${sampling.failed.message}`);
        return encodeValue(req.vmId, req.vpkg, { counter: BigInt(v.counter), energyUj: v.energyUj }, out.tNs, out.ended);
      }
      case T.SUBSCRIBE: {
        if (!registry.owns(conn.id, req.vmId)) return encodeError(E.NO_SUCH, T.SUBSCRIBE, `no VM ${req.vmId} on this connection`);
        const u = updateFrame(req.vmId);
        if (!u) return encodeError(E.NO_SUCH, T.SUBSCRIBE, `no VM ${req.vmId}`);
        // The immediate UPDATE is the acknowledgment; an ended VM gets only this one.
        if (!u.ended) conn.subscriptions.add(req.vmId);
        return u.frame;
      }
      case T.UNREGISTER: {
        if (!registry.owns(conn.id, req.vmId)) return encodeError(E.NO_SUCH, T.UNREGISTER, `no VM ${req.vmId} on this connection`);
        conn.subscriptions.delete(req.vmId);
        releaseVm(req.vmId);
        conn.log.info({ vmId: req.vmId }, 'v2 VM unregistered');
        return encodeOk(req.vmId);
      }
      case T.LIST:
        return encodeVmList(registry.visible(viewerOf(conn), Math.max(1, req.fromId)).map(entryOf));
      case T.OBSERVE: {
        // A VM the peer may not see is answered exactly like one that does not exist.
        const u = registry.canSee(viewerOf(conn), req.vmId) ? updateFrame(req.vmId) : null;
        if (!u) return encodeError(E.NO_SUCH, T.OBSERVE, `no VM ${req.vmId}`);
        if (!u.ended) conn.subscriptions.add(req.vmId);
        return u.frame;
      }
      case T.UNOBSERVE:
        conn.subscriptions.delete(req.vmId);
        return encodeOk(req.vmId);
      case T.HOST_SUBSCRIBE: {
        if (!viewerOf(conn).seesAll) {
          const how = o.observerGid === undefined ? 'start the helper with --observer-group GROUP and add this user to it' : `add this user to group ${o.observerGid} (--observer-group)`;
          return encodeError(E.NOT_PERMITTED, T.HOST_SUBSCRIBE, `host energy is for root and the observer group; ${how}`);
        }
        // A second HOST_SUBSCRIBE on the connection replaces the first's choice of layout.
        hostSubs.set(conn, req.perPackage);
        sampling.hold('host subscriber', true);
        return encodeHostUpdate(hostValues(false, req.perPackage));
      }
    }
  };

  const limiter = new LogLimiter(o.log);
  const host: ConnectionHost = {
    maxBacklogBytes: o.limits.maxBacklogBytes,
    limiter,
    request,
    closed(conn) {
      conns.delete(conn);
      viewers.delete(conn);
      if (hostSubs.delete(conn) && hostSubs.size === 0) sampling.hold('host subscriber', false);
      const vms = registry.vmsOf(conn.id);
      for (const vmId of vms) releaseVm(vmId);
      conn.log.debug({ vms: vms.length }, 'v2 connection closed');
    },
  };

  const listeners = new DisposableStore();
  listeners.add(sampling.onSample((ev) => {
    lastSampleNs = ev.tNs;
    for (const p of ev.result?.packages ?? []) {
      let k = pkgJ.get(p.package);
      if (!k) pkgJ.set(p.package, (k = { energyJ: 0, unattributedJ: 0 }));
      k.energyJ += p.energyJ;
      // Never negative in an interval (attributed can pass energy only by float rounding), so the
      // cumulative value never goes back.
      k.unattributedJ += Math.max(0, p.energyJ - p.attributedJ);
    }
    for (const vmId of ev.ended) {
      const r = registry.get(vmId);
      registry.markEnded(vmId);
      if (r?.discovered) o.discovery?.forget(r.pid);
      vmsChanged = true;
    }
    for (const r of [...registry.all()]) {
      if (r.live || r.owner !== null || !r.discovered) continue;
      if (++r.endedSamples > ENDED_DISCOVERED_KEPT_SAMPLES) dropVm(r.vmId);
    }
    // The host frame is encoded once per layout in use, for all its subscribers.
    const hostFrames = new Map<boolean, Buffer>();
    const hostFrame = (perPackage: boolean): Buffer => {
      let frame = hostFrames.get(perPackage);
      if (!frame) hostFrames.set(perPackage, (frame = encodeHostUpdate(hostValues(vmsChanged, perPackage))));
      return frame;
    };
    // A VM's UPDATE is encoded once per sample, for every connection that watches it.
    const updates = new Map<number, { frame: Buffer; ended: boolean } | null>();
    const updateOf = (vmId: number) => {
      let u = updates.get(vmId);
      if (u === undefined) updates.set(vmId, (u = updateFrame(vmId)));
      return u;
    };
    for (const conn of conns) {
      const perPackage = hostSubs.get(conn);
      if (conn.subscriptions.size === 0 && perPackage === undefined) continue;
      // A connection's frames of one sample leave in one write: its VMs' UPDATEs, then HOST_UPDATE.
      conn.batch(() => {
        for (const vmId of conn.subscriptions) {
          const u = updateOf(vmId);
          if (!u) continue;
          if (u.ended) conn.subscriptions.delete(vmId);
          if (!conn.send(u.frame)) return;
        }
        if (perPackage !== undefined) conn.send(hostFrame(perPackage));
      });
    }
    vmsChanged = false;
  }));

  // onFailure fires once per outage (SamplingService.fail), so each subscriber gets one notice.
  listeners.add(
    sampling.onFailure((err) => {
      for (const conn of conns) {
        if (conn.subscriptions.size > 0 || hostSubs.has(conn)) conn.send(encodeError(E.ENERGY_SOURCE, T.SUBSCRIBE, `sampling failed: ${err.message}; updates resume when it recovers`));
      }
    }),
  );

  const handler: V2Handler = (socket, peer, rest, hold) => {
    if (closed) {
      socket.destroy();
      return;
    }
    const conn = new V2Connection(nextConnId++, socket, peer, host, o.log, hold);
    conns.add(conn);
    viewers.set(conn, {
      connId: conn.id,
      uid: peer.uid,
      seesAll: peer.uid === 0 || (o.observerGid !== undefined && peerInGroup(o.procRoot, peer, o.observerGid)),
    });
    conn.start(rest);
  };

  return {
    handler,
    async close() {
      closed = true;
      listeners.dispose();
      sampling.close();
      limiter.flush();
      const waits = [...conns].map(
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
      return conns.size;
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
