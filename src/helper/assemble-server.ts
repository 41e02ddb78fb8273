/**
 * The server link of the service chain: legacy service -> server. Light, so the daemon serves QEMU
 * before it loads the v2 service's modules (docs/daemon.md "Where the time goes").
 */
import type { Logger } from '../logging/logger.js';
import type { MsrDevice } from '../msr/device.js';
import type { HostPaths } from '../msr/host-paths.js';
import type { AmdSynthConfig } from '../msr/legacy-registers.js';
import type { HostCpu, Vendor } from '../model/host.js';
import { LegacyService, newLegacyCounters, OnlineCpus, type LegacyCounters } from './legacy/legacy-service.js';
import type { HealthSource } from './v2/daemon-counters.js';
import { HelperServer, type HelperServerOptions, type V2Handler } from './server/server.js';
import type { Listener } from './server/listener.js';
import { readStarttime } from '../os/proc-starttime.js';

interface ServerChainOptions {
  paths: HostPaths;
  device: MsrDevice;
  vendor: Vendor;
  /** Why no MSR can be read, when none can (an energy source without MSRs): legacy requests then get 0. */
  noMsrs?: string;
  /** Online CPUs at start (sysfs is re-read for one not listed, at most once a second). */
  cpus: readonly HostCpu[];
  amd: AmdSynthConfig;
  /** The listening socket (bound or adopted by the start-up, or by the tests' fake host). */
  listener: Listener;
  v2Handler?: V2Handler;
  /** Loggers by area ('legacy', 'server'). */
  area(name: string): Logger;
  /** Where the legacy service counts its requests by result (HOST_UPDATE's health figures); default from 0. */
  counters?: LegacyCounters;
  /** --guest-energy exact: hold MSR_PKG_ENERGY_STATUS at 0 until the guest-energy hook is set (LegacyServiceOptions). */
  holdEnergyStatus?: boolean;
  /** The daemon's connection limits; the server's defaults otherwise. */
  server?: Pick<HelperServerOptions, 'maxConnections' | 'incomplete' | 'preferredPeer' | 'qemuPeer' | 'keep'>;
}

export interface ServerChain {
  legacy: LegacyService;
  server: HelperServer;
  /** Legacy requests by result and open connections, for the v2 service's HOST_UPDATE: made here, once. */
  health: HealthSource;
}

/** Legacy service -> server (which hands v2 connections to v2Handler). Not serving yet (server.serve()). */
export function assembleServer(o: ServerChainOptions): ServerChain {
  const counters = o.counters ?? newLegacyCounters();
  const legacy = new LegacyService({
    device: o.device,
    vendor: o.vendor,
    procRoot: o.paths.procRoot,
    cpus: new OnlineCpus(
      o.paths.sysRoot,
      o.cpus.map((c) => c.cpu),
    ),
    amd: o.amd,
    ...(o.noMsrs !== undefined ? { noMsrs: o.noMsrs } : {}),
    logger: o.area('legacy'),
    counters,
    ...(o.holdEnergyStatus === true ? { holdEnergyStatus: true } : {}),
  });
  const server = new HelperServer({
    listener: o.listener,
    legacy,
    logger: o.area('server'),
    starttimeOf: (pid) => readStarttime(o.paths.procRoot, pid),
    ...o.server,
    ...(o.v2Handler ? { v2Handler: o.v2Handler } : {}),
  });
  return { legacy, server, health: { legacy: counters, connections: () => server.connections } };
}
