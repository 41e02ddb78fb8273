/**
 * The v2 service: the entry point the daemon wires in. It owns the VM registry, the sampling loop and
 * the connections; the daemon's server hands it every connection that starts with the v2 magic.
 * The wire rules are in docs/protocol.md; the choices where they are silent in docs/protocol-v2.md.
 */
import { RatioEngine } from '../../ratio/attribution.js';
import type { HostInfo } from '../../ratio/types.js';
import { SamplingService, type Engine, type SamplingServiceOptions, type SamplingStats } from '../sampling-service.js';
import { DEFAULT_V2_LIMITS, VmRegistry, procView, type V2Limits } from './vm-registry.js';
import { E, T, encodeError, encodeOk, encodeRegistered, encodeUpdate, encodeValue } from '../../protocol/v2/codec.js';
import { V2Connection, type ConnectionHost } from './connection.js';
import type { ClientRequest } from '../../protocol/v2/messages.js';
import type { V2Handler } from '../server.js';

export type { V2Limits, V2Handler };
export { DEFAULT_V2_LIMITS };

/** The sampling loop's options (engine optional: one is made from `host`), plus v2's own. */
export interface V2ServiceOptions extends Omit<SamplingServiceOptions, 'engine'> {
  host: HostInfo;
  engine?: Engine;
  procRoot: string;
  limits: V2Limits;
}

export interface V2Service {
  handler: V2Handler;
  /** Disconnects every v2 client (their VMs are unregistered) and stops the loop. */
  close(): Promise<void>;
  readonly stats: SamplingStats;
  /** The sampling loop has a tick pending (false while no registered VM is live). */
  readonly running: boolean;
  readonly connections: number;
  readonly vms: number;
}

export function createV2Service(o: V2ServiceOptions): V2Service {
  const engine = o.engine ?? new RatioEngine(o.host);
  const sampling = new SamplingService({
    engine,
    sampler: o.sampler,
    intervalMs: o.intervalMs,
    trace: o.trace,
    forgetPid: o.forgetPid,
    log: o.log,
    clock: o.clock,
  });
  const registry = new VmRegistry(o.limits, procView(o.procRoot));
  const conns = new Set<V2Connection>();
  let nextConnId = 1;
  let closed = false;

  const dropVm = (vmId: number) => {
    sampling.unregister(vmId);
    registry.remove(vmId);
  };

  const updateFrame = (vmId: number): { frame: Buffer; ended: boolean } | null => {
    const out = sampling.output(vmId);
    if (!out) return null;
    const values = out.vpkgs.map((v) => ({ counter: BigInt(v.counter), energyUj: v.energyUj }));
    return { frame: encodeUpdate(vmId, out.tNs, values, out.ended), ended: out.ended };
  };

  const request = (conn: V2Connection, req: ClientRequest): Buffer => {
    switch (req.type) {
      case T.REGISTER: {
        const a = registry.admit(conn.id, conn.peer, req);
        if (!a.ok) return encodeError(a.code, T.REGISTER, a.message);
        const vmId = sampling.register(a.spec);
        registry.add(conn.id, vmId, a.spec.pid);
        conn.log.info({ vmId, pid: a.spec.pid, vcpus: a.spec.vcpus.length }, 'v2 VM registered');
        return encodeRegistered(vmId, sampling.nvpkg(vmId), sampling.guestPowerUnit);
      }
      case T.READ: {
        if (!registry.owns(conn.id, req.vmId)) return encodeError(E.NO_SUCH, T.READ, `no VM ${req.vmId} on this connection`);
        const out = sampling.output(req.vmId);
        const v = out?.vpkgs[req.vpkg];
        if (!out || !v) return encodeError(E.NO_SUCH, T.READ, `VM ${req.vmId} has no virtual package ${req.vpkg} (it has ${out?.vpkgs.length ?? 0})`);
        if (sampling.failed && !out.ended) return encodeError(E.ENERGY_SOURCE, T.READ, `energy source failed: ${sampling.failed.message}`);
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
      case T.LIST:
      case T.OBSERVE:
      case T.UNOBSERVE:
      case T.HOST_SUBSCRIBE:
        // The observer requests are answered by the discovery/observer service (next commits).
        return encodeError(E.MALFORMED, req.type, 'observer requests are not served by this helper yet');
      case T.UNREGISTER: {
        if (!registry.owns(conn.id, req.vmId)) return encodeError(E.NO_SUCH, T.UNREGISTER, `no VM ${req.vmId} on this connection`);
        conn.subscriptions.delete(req.vmId);
        dropVm(req.vmId);
        conn.log.info({ vmId: req.vmId }, 'v2 VM unregistered');
        return encodeOk(req.vmId);
      }
    }
  };

  const host: ConnectionHost = {
    maxBacklogBytes: o.limits.maxBacklogBytes,
    request,
    closed(conn) {
      conns.delete(conn);
      const vms = registry.vmsOf(conn.id);
      for (const vmId of vms) dropVm(vmId);
      conn.log.debug({ vms: vms.length }, 'v2 connection closed');
    },
  };

  sampling.onSample((ev) => {
    for (const vmId of ev.ended) registry.markEnded(vmId);
    for (const conn of conns) {
      for (const vmId of conn.subscriptions) {
        const u = updateFrame(vmId);
        if (!u) continue;
        if (u.ended) conn.subscriptions.delete(vmId);
        if (!conn.send(u.frame)) break;
      }
    }
  });

  // onFailure fires once per outage (SamplingService.fail), so each subscriber gets one notice.
  sampling.onFailure((err) => {
    for (const conn of conns) {
      if (conn.subscriptions.size > 0) conn.send(encodeError(E.ENERGY_SOURCE, T.SUBSCRIBE, `energy source failed: ${err.message}; updates resume when it recovers`));
    }
  });

  const handler: V2Handler = (socket, peer, rest) => {
    if (closed) {
      socket.destroy();
      return;
    }
    const conn = new V2Connection(nextConnId++, socket, peer, host, o.log);
    conns.add(conn);
    conn.start(rest);
  };

  return {
    handler,
    async close() {
      closed = true;
      sampling.close();
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
  };
}
