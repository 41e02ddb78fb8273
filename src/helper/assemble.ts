/**
 * THE assembly of the service chain: host info -> energy source -> task reader -> sampler -> v2
 * service -> legacy service -> server. Each link is built here and nowhere else (the last two in
 * assemble-server.ts, which the daemon loads before this module: it serves QEMU first); the daemon
 * (through its v2 plugin and runDaemon), the tests' harness and the bench all call these functions.
 */
import fs from 'node:fs';
import type { Logger } from '../logging/logger.js';
import { cannotError } from '../common/errors.js';
import { LogLimiter } from '../logging/log-limiter.js';
import { msrErrorWithHint, type MsrDevice } from '../msr/device.js';
import { createEnergySource, readHostInfoFor, withDomainCounters } from '../energy/create.js';
import { DEFAULT_CHAIN_ENERGY_SOURCE, type EnergySourceKind } from '../energy/kinds.js';
import type { EnergyDomain, EnergySource } from '../energy/energy-source.js';
import type { HostPaths } from '../msr/host-paths.js';
import { ProcTaskReader, type KeptFdLedger } from '../os/proc-tasks.js';
import { DEFAULT_MAX_VM_THREADS, VmFdShares } from '../os/vm-fd-shares.js';
import { shareOwnerOf } from '../os/preferred-owner.js';
import type { HostInfo, Vendor } from '../ratio/types.js';
import { Sampler } from '../sampling/sampler.js';
import { TraceWriter } from '../trace/writer.js';
import { ProcScanner, type ScannerOptions } from '../discovery/scanner.js';
import { DEFAULT_MAX_DISCOVERED_VMS } from '../discovery/limits.js';
import type { DaemonContext, DaemonPlugin } from './lifecycle/config.js';
import { newLegacyCounters, type LegacyCounters, type LegacyService } from './legacy/legacy-service.js';
import type { TraceSink } from '../sampling/sampling-service.js';
import type { HelperServer } from './server/server.js';
import { openListener, type ListenOptions, type ListenTarget } from './server/listener.js';
import { assembleServer, type ServerChainOptions } from './assemble-server.js';
import { sendWithFdsOnSocket } from './v2/socket-fd-sender.js';
import type { StateSnapshot } from '../state/snapshot.js';
import { DEFAULT_GUEST_ENERGY, type GuestEnergyMode } from '../guest-energy/modes.js';
import { GuestEnergy } from './guest/guest-energy.js';
import { joulesPerCounterUnit } from '../ratio/counter.js';
import { monotonicNs } from '../sampling/tick-loop.js';
import { createV2Service, type FdAdmitter, type HealthSource, type V2Limits, type V2Service } from './v2/service.js';

export interface V2ChainOptions {
  paths: HostPaths;
  /** MSR fds, shared with the legacy service; the caller opens and closes them. */
  device: MsrDevice;
  vendor: Vendor;
  /** Where energy comes from (the daemon's --energy-source, resolved); default DEFAULT_CHAIN_ENERGY_SOURCE. */
  energySource?: EnergySourceKind;
  /** --domains: the RAPL domains to read besides the package; default every one the source finds. */
  domains?: readonly EnergyDomain[];
  intervalMs: number;
  limits: V2Limits;
  /** Where samples are recorded, made once the host is known (a trace header needs it). */
  trace?: (host: HostInfo) => TraceSink | undefined;
  log: Logger;
  /** The sampling loop's clock, for tests; default the monotonic clock. */
  clock?: () => bigint;
  /**
   * Scan paths.procRoot for QEMU/KVM processes (default off here; the daemon's --no-discovery turns
   * it off there). An object turns it on with these scanner settings (tests).
   */
  discovery?: boolean | Partial<Omit<ScannerOptions, 'clkTck'>>;
  /** No scan before service.startDiscovery() (the daemon: once its privileges are dropped). */
  deferDiscovery?: boolean;
  /** --observer-group, resolved: its members see every VM and the host. */
  observerGid?: number;
  /** Opens a powercap energy_uj file (the daemon: the fd its start-up opened as root). */
  openPowercap?: (file: string) => number;
  /** Legacy request counts and connections for HOST_UPDATE. */
  health?: HealthSource;
  /** The daemon's fd budget for discovered VMs. */
  fds?: FdAdmitter;
  /** How many fds each sampled process may keep (the daemon's VmFdShares, the same object as `fds`). */
  ledger?: KeptFdLedger;
  /** Live state a previous process saved (V2ServiceOptions.restore), and how long its registrations wait. */
  restore?: StateSnapshot;
  restoreWaitMs?: number;
  /** --guest-energy exact: a VM's guest energy against its exact energy (V2ServiceOptions.guest). */
  guest?: (vmId: number) => { guestJ: number; exactJ: number } | undefined;
}

export interface V2Chain {
  host: HostInfo;
  service: V2Service;
  tasks: ProcTaskReader;
  /** Stops the service and closes the task reader (not the device, not the trace). */
  close(): Promise<void>;
}

/** Host info -> energy source -> /proc task reader -> sampler -> v2 service (restored in slices: createV2Service). */
export async function assembleV2(o: V2ChainOptions): Promise<V2Chain> {
  const kind = o.energySource ?? DEFAULT_CHAIN_ENERGY_SOURCE;
  let host: HostInfo;
  try {
    host = readHostInfoFor(kind, { paths: o.paths, device: o.device, vendor: o.vendor });
  } catch (e) {
    throw msrErrorWithHint(e);
  }
  const tasks = new ProcTaskReader(o.paths.procRoot, o.ledger ? { ledger: o.ledger } : {});
  let energy: EnergySource;
  try {
    energy = createEnergySource(kind, {
      host,
      paths: o.paths,
      device: o.device,
      ...(o.domains ? { domains: o.domains } : {}),
      ...(o.openPowercap ? { openPowercap: o.openPowercap } : {}),
    });
  } catch (e) {
    throw msrErrorWithHint(e);
  }
  host = withDomainCounters(host, energy);
  // A synthetic source is no measurement: said at warning level, so a terse log (-q, journalctl -p warning) shows it too.
  o.log[energy.kind === 'synthetic' ? 'warn' : 'info']({ source: energy.kind, domains: energy.domains }, energy.describe());
  const limiter = new LogLimiter(o.log);
  const sampler = new Sampler(
    energy,
    tasks,
    undefined,
    (e) =>
      limiter.warn(
        'energy domain',
        { domains: e.domains, err: e.message },
        'an energy domain could not be read; the package and the other domains go on',
      ),
    (pid, e) =>
      limiter.error(
        'VM threads unreadable',
        { vm: { pid }, err: e.message },
        "a VM's threads could not be read: its VM ends; the others go on",
      ),
  );
  const discovery = o.discovery
    ? new ProcScanner(o.paths.procRoot, { ...(o.discovery === true ? {} : o.discovery), clkTck: host.clkTck })
    : undefined;
  const service = await createV2Service({
    host,
    energySource: energy.kind,
    sampler,
    procRoot: o.paths.procRoot,
    intervalMs: o.intervalMs,
    limits: o.limits,
    trace: o.trace?.(host),
    forgetPid: (pid) => tasks.forget(pid),
    // A registration opens its threads' stat files at once, so running out of fds refuses it.
    openPid: (pid) => void tasks.read(pid),
    notWhole: (pid) => tasks.notWhole(pid),
    log: o.log,
    clock: o.clock,
    ...(discovery ? { discovery, deferDiscovery: o.deferDiscovery === true } : {}),
    ...(o.observerGid !== undefined ? { observerGid: o.observerGid } : {}),
    ...(o.health ? { health: o.health } : {}),
    ...(o.fds ? { fds: o.fds } : {}),
    sendWithFds: sendWithFdsOnSocket,
    ...(o.restore ? { restore: o.restore } : {}),
    ...(o.restoreWaitMs !== undefined ? { restoreWaitMs: o.restoreWaitMs } : {}),
    ...(o.guest ? { guest: o.guest } : {}),
  });
  return {
    host,
    service,
    tasks,
    async close() {
      await service.close();
      tasks.close();
      energy.close();
    },
  };
}

export interface ChainOptions
  extends Omit<V2ChainOptions, 'log' | 'health'>, Omit<ServerChainOptions, 'v2Handler' | 'cpus' | 'counters' | 'listener'> {
  /** Where to listen: bound (or adopted) by openListener, the one bind. */
  target: ListenTarget;
  /** The socket file's mode and group (default 0600, unchanged group). */
  socket?: Omit<ListenOptions, 'file'>;
}

export interface Chain extends V2Chain {
  server: HelperServer;
  legacy: LegacyService;
  /** Closes the v2 service, then the server. */
  close(): Promise<void>;
}

/** The whole chain, serving, as the daemon runs it minus its lifecycle (checks, privilege drop, signals). */
export async function assembleChain(o: ChainOptions): Promise<Chain> {
  const listener = await openListener(o.target, o.socket);
  const counters: LegacyCounters = newLegacyCounters();
  // Set once the server is made; the health source reads it later (0 connections before).
  let server: HelperServer | undefined = undefined;
  const health: HealthSource = { legacy: counters, connections: () => server?.connections ?? 0 };
  let v2: V2Chain;
  try {
    v2 = await assembleV2({ ...o, log: o.area('v2'), health });
  } catch (e) {
    await listener.close(o.area('server'));
    throw e;
  }
  const { legacy, server: made } = assembleServer({ ...o, listener, cpus: v2.host.cpus, v2Handler: v2.service.handler, counters });
  server = made;
  server.serve();
  return {
    ...v2,
    legacy,
    server,
    async close() {
      await v2.close();
      await made.close();
    },
  };
}

/** What the daemon's command line decides for the v2 service. */
export interface V2DaemonSettings {
  intervalMs: number;
  limits: V2Limits;
  recordPath?: string;
  /** Scan /proc for QEMU/KVM processes (default on; --no-discovery). */
  discovery: boolean;
  /** --observer-group, resolved. */
  observerGid?: number;
  /** --domains, parsed. */
  domains?: readonly EnergyDomain[];
  /** --max-discovered-vms (default DEFAULT_MAX_DISCOVERED_VMS). */
  maxDiscoveredVms?: number;
  /** --max-vm-threads (default DEFAULT_MAX_VM_THREADS). */
  maxVmThreads?: number;
  /** --guest-energy (default raw). */
  guestEnergy?: GuestEnergyMode;
}

/**
 * The v2 service as a daemon plugin: host facts and package energy from the daemon's MSR fds (opened
 * before the privilege drop, as is the trace file), /proc from the configured root.
 */
export function v2DaemonPlugin(o: V2DaemonSettings): DaemonPlugin {
  return {
    name: 'v2',
    async setup(ctx) {
      const log = ctx.area('v2');
      const paths = ctx.config.hostPaths;
      const recordPath = o.recordPath;
      let trace: TraceWriter | undefined;
      const events = {
        paused: (why: string) =>
          log.warn(
            { record: recordPath, err: why },
            'recording paused: disk full; the trace ends on its last whole record, and each interval tries again',
          ),
        resumed: (lost: number, s: number) =>
          log.info(
            { record: recordPath, lostSamples: lost, pausedS: Math.round(s * 10) / 10 },
            'recording resumed (a gap record marks the lost samples)',
          ),
      };
      // Opened before the privilege drop and passed across the re-exec (helper/privileged-start). After
      // a restart in place with its state, the trace goes on (docs/daemon.md "Restarts").
      const openTrace = (path: string, host: HostInfo): TraceWriter => {
        const fd = ctx.openedFile(path);
        if (ctx.restarted && ctx.restored !== undefined && fd !== undefined) {
          try {
            const w = TraceWriter.resume(path, fd, { events });
            log.info({ record: path }, 'recording goes on after the restart');
            return w;
          } catch (e) {
            log.warn({ record: path, err: (e as Error).message }, 'cannot go on with the trace: a new one starts');
          }
        }
        // A restart without the state starts the trace anew: what the last process wrote is cut off.
        if (ctx.restarted && fd !== undefined) fs.ftruncateSync(fd, 0);
        return TraceWriter.open(
          path,
          { host, note: `recorded live by the vmsr-helper daemon (v2 service, interval ${o.intervalMs} ms)` },
          { overwrite: true, fd, events },
        );
      };
      // Processes of root and of the socket's group are preferred by the per-uid shares (common/uid-share.ts).
      const preferredGroups = ctx.config.socketGid !== undefined ? [ctx.config.socketGid] : [];
      const shares = new VmFdShares({
        budget: ctx.fds,
        maxVmThreads: o.maxVmThreads ?? DEFAULT_MAX_VM_THREADS,
        owner: (pid) => shareOwnerOf(paths.procRoot, pid, preferredGroups),
      });
      const limiter = new LogLimiter(log);
      // Made once the service is (it finds VMs through it); the statistics files ask it from the start.
      let guest: GuestEnergy | undefined;
      const v2 = await assembleV2({
        paths,
        device: ctx.device,
        vendor: ctx.vendor,
        energySource: ctx.energySource,
        openPowercap: (file) => {
          const fd = ctx.powercapFd(file);
          if (fd === undefined) throw cannotError(`open ${file}`, 'the start-up did not open it as root', 'restart the daemon');
          return fd;
        },
        ...(o.domains ? { domains: o.domains } : {}),
        intervalMs: o.intervalMs,
        limits: o.limits,
        fds: shares,
        ledger: shares,
        log,
        // The daemon replaces its trace at each start (docs/recording.md): refusing would turn a
        // systemd restart into a restart loop.
        trace: (host) => (recordPath === undefined ? undefined : (trace = openTrace(recordPath, host))),
        discovery: o.discovery && {
          ...(o.maxDiscoveredVms !== undefined ? { maxDiscoveredVms: o.maxDiscoveredVms } : {}),
          preferredGroups,
          onFull: (f) => limiter.warn('discovery full', { vm: { pid: f.pid, uid: f.uid }, bound: f.bound, tracked: f.tracked }, f.message),
        },
        deferDiscovery: true,
        ...(o.observerGid !== undefined ? { observerGid: o.observerGid } : {}),
        health: ctx.health,
        ...(ctx.restored ? { restore: ctx.restored } : {}),
        ...(o.guestEnergy === 'exact' ? { guest: (vmId: number) => guest?.view(vmId) } : {}),
      });
      const service = v2.service;
      if (o.guestEnergy === 'exact') {
        guest = exactGuestEnergy(ctx, v2.host, service, shares.maxVmThreads);
        const g = guest;
        const held = ctx.answerEnergyStatus((pid, cpu) => g.answer(pid, cpu));
        g.restore(ctx.restored?.guest ?? [], held);
      }
      ctx.onRestart({
        begin: () => service.restarting(),
        get drained() {
          return service.drained;
        },
        snapshot: () => (guest ? { ...service.snapshot(), guest: guest.state() } : service.snapshot()),
        abort: () => service.restartAborted(),
      });
      // The first scan runs with the privileges the daemon keeps, not those it starts with.
      ctx.onReady(() => v2.service.startDiscovery());
      ctx.onShutdown(async () => {
        await v2.close();
        await trace?.close();
        limiter.flush();
      });
      log.info(
        {
          intervalMs: o.intervalMs,
          limits: o.limits,
          // A setting not given is left out, not logged as null.
          ...(o.recordPath !== undefined ? { record: o.recordPath } : {}),
          discovery: o.discovery,
          maxDiscoveredVms: o.maxDiscoveredVms ?? DEFAULT_MAX_DISCOVERED_VMS,
          maxVmThreads: shares.maxVmThreads,
          guestEnergy: o.guestEnergy ?? DEFAULT_GUEST_ENERGY,
          ...(o.observerGid !== undefined ? { observerGid: o.observerGid } : {}),
        },
        'v2 service ready',
      );
      return { v2Handler: v2.service.handler };
    },
  };
}

/**
 * --guest-energy exact's answers (helper/guest/guest-energy.ts), on the host's topology and the
 * guest's energy unit (the engine's: QEMU passes the host's unit to its guests).
 */
function exactGuestEnergy(ctx: DaemonContext, host: HostInfo, service: V2Service, maxThreads: number): GuestEnergy {
  return new GuestEnergy({
    procRoot: ctx.config.hostPaths.procRoot,
    host,
    unitJ: joulesPerCounterUnit(service.guestPowerUnit),
    find: (pid) => service.guestVm(pid),
    log: ctx.area('guest'),
    clock: monotonicNs,
    maxThreads,
  });
}
