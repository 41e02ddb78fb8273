/** THE v2 chain: host info -> energy source -> task reader -> sampler -> v2 service, for the daemon, the tests' fake host and the bench. */
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
import { VmFdShares } from '../budget/vm-fd-shares.js';
import { DEFAULT_MAX_VM_THREADS } from '../model/vcpus.js';
import { shareOwnerOf } from '../budget/preferred-owner.js';
import type { HostInfo, Vendor } from '../model/host.js';
import { Sampler } from '../sampling/sampler.js';
import { TraceWriter } from '../trace/writer.js';
import { ProcScanner, type ScannerOptions } from '../discovery/scanner.js';
import { DEFAULT_MAX_DISCOVERED_VMS } from '../discovery/discovery-limits.js';
import type { FdBudget } from '../budget/fd-budget.js';
import type { TraceSink } from '../sampling/sampling-service.js';
import { MSG_DONTWAIT, sendFds, socketFd } from '../os/libc/sockets.js';
import type { SendWithFds } from './v2/reply.js';
import type { StateSnapshot } from '../state/snapshot.js';
import { DEFAULT_GUEST_ENERGY, type GuestEnergyMode } from '../guest-energy/modes.js';
import type { LegacyService } from './legacy/legacy-service.js';
import { cgroupBandwidth } from '../power-limit/cgroups.js';
import { createV2Service, type V2ServiceOptions } from './v2/service.js';
import type { HealthSource } from './v2/host-energy.js';

/** One non-blocking sendmsg(2) with the reply's fds in SCM_RIGHTS: a client that does not read never blocks the loop (EAGAIN throws). */
export const sendWithFdsOnSocket: SendWithFds = (socket, frame, fds) => {
  const fd = socketFd(socket);
  if (fd === undefined) throw new Error('the connection has no file descriptor (it closed)');
  return sendFds(fd, frame, fds, MSG_DONTWAIT);
};

type PassedOptions =
  | 'intervalMs'
  | 'limits'
  | 'log'
  | 'clock'
  | 'deferDiscovery'
  | 'observerGid'
  | 'health'
  | 'fds'
  | 'restore'
  | 'restoreWaitMs'
  | 'guestDir'
  | 'powerLimits';

export interface V2ChainOptions extends Pick<V2ServiceOptions, PassedOptions> {
  paths: HostPaths;
  /** MSR fds, shared with the legacy service; the caller opens and closes them. */
  device: MsrDevice;
  vendor: Vendor;
  /** Where energy comes from (the daemon's --energy-source, resolved); default DEFAULT_CHAIN_ENERGY_SOURCE. */
  energySource?: EnergySourceKind;
  /** --domains: the RAPL domains to read besides the package; default every one the source finds. */
  domains?: readonly EnergyDomain[];
  /** Where samples are recorded, made once the host is known (a trace header needs it). */
  trace?: (host: HostInfo) => TraceSink | undefined;
  /** Scan paths.procRoot for QEMU/KVM processes (default off); an object: with these scanner settings (tests). */
  discovery?: boolean | Partial<Omit<ScannerOptions, 'clkTck'>>;
  /** Opens a powercap energy_uj file (the daemon: the fd its start-up opened as root). */
  openPowercap?: (file: string) => number;
  /** How many fds each sampled process may keep (the daemon's VmFdShares, the same object as `fds`). */
  ledger?: KeptFdLedger;
  guestEnergy?: Omit<NonNullable<V2ServiceOptions['guestEnergy']>, 'heldFds' | 'ledger'>;
}

/** Host info -> energy source -> /proc task reader -> sampler -> v2 service (restored in slices: createV2Service). */
export async function assembleV2(o: V2ChainOptions) {
  const { paths, device, vendor, energySource, domains, trace, discovery: scan, openPowercap, ledger, guestEnergy, ...passed } = o;
  const kind = energySource ?? DEFAULT_CHAIN_ENERGY_SOURCE;
  let host: HostInfo;
  let energy: EnergySource;
  try {
    host = readHostInfoFor(kind, { paths, device, vendor });
    energy = createEnergySource(kind, { host, paths, device, domains, openPowercap });
  } catch (e) {
    throw msrErrorWithHint(e);
  }
  const tasks = new ProcTaskReader(paths.procRoot, { ledger });
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
  const discovery = scan ? new ProcScanner(paths.procRoot, { ...(scan === true ? {} : scan), clkTck: host.clkTck }) : undefined;
  const service = await createV2Service({
    ...passed,
    host,
    energySource: energy.kind,
    sampler,
    procRoot: paths.procRoot,
    trace: trace?.(host),
    forgetPid: (pid) => tasks.forget(pid),
    // A registration opens its threads' stat files at once, so running out of fds refuses it.
    openPid: (pid) => void tasks.read(pid),
    notWhole: (pid) => tasks.notWhole(pid),
    discovery,
    sendWithFds: sendWithFdsOnSocket,
    // Guest energy reads through the sampler's held fds, and the VMs' fd shares for its pidfds.
    guestEnergy: guestEnergy && { ...guestEnergy, heldFds: (pid, tid) => tasks.heldFds(pid, tid), ledger },
  });
  return {
    host,
    service,
    tasks,
    /** Stops the service and closes the task reader (not the device, not the trace). */
    async close() {
      await service.close();
      tasks.close();
      energy.close();
    },
  };
}

export type V2Chain = Awaited<ReturnType<typeof assembleV2>>;

/** What the daemon's command line decides for the v2 service; guestDir absent: --no-guest-dir. */
export interface V2DaemonSettings extends Pick<V2ChainOptions, 'intervalMs' | 'limits' | 'observerGid' | 'domains' | 'guestDir'> {
  recordPath?: string;
  /** Scan /proc for QEMU/KVM processes (default on; --no-discovery). */
  discovery: boolean;
  maxDiscoveredVms?: number;
  maxVmThreads?: number;
  guestEnergy?: GuestEnergyMode;
  /** --power-limits FILE (docs/power-limits.md "The limits file"). */
  powerLimitsFile?: string;
}

interface V2Start {
  config: { hostPaths: HostPaths; socketGid?: number };
  /** What the start-up opened as root: MSR fds, [energy_uj path, fd] of powercap zones, [path, fd] of --record. */
  opened: Pick<V2ChainOptions, 'vendor' | 'device'> &
    Record<'powercap' | 'files', ReadonlyMap<string, number>> & { energy: EnergySourceKind };
  fds: FdBudget;
  health: HealthSource;
  /** The live state the previous process handed over, read and checked; absent at a fresh start. */
  restored?: StateSnapshot;
  /** This start follows a restart: the --record file goes on where the last process stopped. */
  restarted: boolean;
  area(name: string): Logger;
  /** Answers QEMU's MSR_PKG_ENERGY_STATUS through `hook` from now on; returns the peers answered 0 meanwhile. */
  answerEnergyStatus: LegacyService['setEnergyStatus'];
}

/** The v2 service as the daemon runs it, on the fds its start-up opened before the privilege drop. */
export async function assembleDaemonV2(o: V2DaemonSettings, start: V2Start) {
  const log = start.area('v2');
  const paths = start.config.hostPaths;
  let trace: TraceWriter | undefined;
  // Processes of root and of the socket's group are preferred by the per-uid shares (budget/uid-share.ts).
  const preferredGroups = start.config.socketGid !== undefined ? [start.config.socketGid] : [];
  const { recordPath, maxDiscoveredVms, maxVmThreads = DEFAULT_MAX_VM_THREADS, discovery, guestEnergy, powerLimitsFile, ...chosen } = o;
  const shares = new VmFdShares({
    budget: start.fds,
    maxVmThreads,
    owner: (pid) => shareOwnerOf(paths.procRoot, pid, preferredGroups),
  });
  const limiter = new LogLimiter(log);
  const v2 = await assembleV2({
    paths,
    device: start.opened.device,
    vendor: start.opened.vendor,
    energySource: start.opened.energy,
    openPowercap: (file) => {
      const fd = start.opened.powercap.get(file);
      if (fd === undefined) throw cannotError(`open ${file}`, 'the start-up did not open it as root', 'restart the daemon');
      return fd;
    },
    ...chosen,
    fds: shares,
    ledger: shares,
    log,
    // Replaced at each start (docs/recording.md): refusing would turn a systemd restart into a restart loop.
    trace: (host) => (recordPath === undefined ? undefined : (trace = openDaemonTrace(recordPath, host, o.intervalMs, start, log))),
    discovery: discovery && {
      maxDiscoveredVms,
      preferredGroups,
      // Rate-limited per bound: other uids' refusals (their shares) never hide that the cap itself is full.
      onFull: (f) =>
        limiter.warn(`discovery full: ${f.bound}`, { vm: { pid: f.pid, uid: f.uid }, bound: f.bound, tracked: f.tracked }, f.message),
    },
    deferDiscovery: true,
    health: start.health,
    guestEnergy:
      guestEnergy === 'exact'
        ? {
            maxThreads: maxVmThreads,
            log: start.area('guest'),
            preferredGroups,
            maxPeers: maxDiscoveredVms,
            answer: (guest) => start.answerEnergyStatus(guest),
          }
        : undefined,
    restore: start.restored,
    powerLimits: { open: cgroupBandwidth(paths.procRoot), adminGid: start.config.socketGid, file: powerLimitsFile },
  });
  // Pino leaves a setting not given (undefined) out of the line.
  log.info(
    {
      intervalMs: o.intervalMs,
      limits: o.limits,
      record: recordPath,
      discovery: o.discovery,
      maxDiscoveredVms: maxDiscoveredVms ?? DEFAULT_MAX_DISCOVERED_VMS,
      maxVmThreads,
      guestDir: o.guestDir,
      guestEnergy: o.guestEnergy ?? DEFAULT_GUEST_ENERGY,
      observerGid: o.observerGid,
    },
    'v2 service ready',
  );
  return {
    service: v2.service,
    /** The first scan, with the privileges the daemon keeps: resolves once its first interval ran. */
    ready: () => v2.service.startDiscovery(),
    async close() {
      await v2.close();
      await trace?.close();
      limiter.flush();
    },
  };
}

/** The --record trace: after a restart with its state it goes on, otherwise it starts anew (docs/daemon.md "Restarts"). */
function openDaemonTrace(path: string, host: HostInfo, intervalMs: number, start: V2Start, log: Logger): TraceWriter {
  const events = {
    paused: (why: string) =>
      log.warn(
        { record: path, err: why },
        'recording paused: disk full; the trace ends on its last whole record, and each interval tries again',
      ),
    resumed: (lost: number, s: number) =>
      log.info(
        { record: path, lostSamples: lost, pausedS: Math.round(s * 10) / 10 },
        'recording resumed (a gap record marks the lost samples)',
      ),
  };
  const fd = start.opened.files.get(path);
  // A start that opened the file itself (from the fd store, after a crash) emptied it: a new trace, with its header.
  if (start.restarted && start.restored !== undefined && fd !== undefined && fs.fstatSync(fd).size > 0) {
    try {
      const w = TraceWriter.resume(path, fd, { events });
      log.info({ record: path }, 'recording goes on after the restart');
      return w;
    } catch (e) {
      log.warn({ record: path, err: (e as Error).message }, 'cannot go on with the trace: a new one starts');
    }
  }
  if (start.restarted && fd !== undefined) fs.ftruncateSync(fd, 0);
  return TraceWriter.open(
    path,
    { host, note: `recorded live by the vmsr-helper daemon (v2 service, interval ${intervalMs} ms)` },
    { overwrite: true, fd, events },
  );
}
