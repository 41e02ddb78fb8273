/**
 * The daemon's life: checks, MSR fds, listening socket, pidfile, privilege drop, READY; then, on
 * SIGTERM/SIGINT/SIGHUP: stop accepting, close clients, run shutdown hooks, remove what we created.
 * Other services (v2, trace writers) plug in through DaemonPlugin / RunDaemonOptions.
 */
import fs from 'node:fs';
import { MsrDevice } from '../msr/device.js';
import type { HostPaths } from '../msr/host-paths.js';
import type { AmdSynthConfig } from '../msr/legacy-registers.js';
import type { Vendor } from '../ratio/types.js';
import type { HostCpu } from '../ratio/types.js';
import { createLogger, type Logger, type LogLevel } from '../logging/logger.js';
import { newLegacyCounters, type LegacyCounters, type LegacyService } from './legacy/legacy-service.js';
import type { HelperServer, ListenTarget, V2Handler } from './server/server.js';
import { assembleServer } from './assemble.js';
import type { HealthSource } from './v2/service.js';
import { DisposableStore, listen } from '../common/disposable.js';
import { DEFAULT_INCOMPLETE_LIMITS, IncompleteFrames } from './server/incomplete-frames.js';
import { countOpenFds, effectiveMaxConnections, FdBudget, raiseFdLimit } from '../os/fd-budget.js';
import { activationFd, Notifier, takeActivation } from './lifecycle/systemd.js';
import { acquirePidfile, pidfileOf, type Pidfile } from './lifecycle/pidfile.js';
import type { Inherited } from './lifecycle/privileged-start.js';
import { removeOwnSocketFile } from './server/socket-file.js';
import { dropPrivileges } from '../os/privileges/capabilities.js';
import { capHex, describeThreads, parseProcStatus } from '../os/privileges/proc-status.js';
import { checkPermission, checkTopology, checkVendor, openMsrDevices, type VendorChoice } from './lifecycle/startup-checks.js';
import { isDaemonChild, reportReady } from './lifecycle/daemonize.js';
import { settleOnce } from './lifecycle/memory-settler.js';

export type { V2Handler };

export interface DaemonConfig {
  socketPath: string;
  /** -k was given (an error together with socket activation). */
  socketPathGiven: boolean;
  pidfile: string;
  /** -f was given: the pidfile is written even without -d. */
  pidfileGiven: boolean;
  daemonize: boolean;
  uid?: number;
  gid?: number;
  logLevel: LogLevel;
  /** -T patterns: areas (glob, '*' wildcard) logged at debug level. */
  traceAreas: string[];
  hostPaths: HostPaths;
  vendor: VendorChoice;
  amd: AmdSynthConfig;
  /** --max-connections (lowered at start-up when the fd limit cannot hold it). */
  maxConnections: number;
  /** --frame-timeout: how long a frame or request may stay incomplete, ms. */
  frameTimeoutMs: number;
  /** --socket-mode: permission bits of the socket file (default 0600). */
  socketMode: number;
  /** --socket-group: group of the socket file. */
  socketGid?: number;
}

export type ShutdownHook = () => void | Promise<void>;

/** Longest wait for the ready hooks' start-up work before the start-up memory settle runs anyway. */
export const STARTUP_SETTLE_WAIT_MS = 2000;

/** What a plugin gets at start-up: after the checks and MSR opens, before listening and dropping. */
export interface DaemonContext {
  config: DaemonConfig;
  vendor: Vendor;
  cpus: HostCpu[];
  /** The shared MSR fds (opened as root); read them only on the main thread. */
  device: MsrDevice;
  logger: Logger;
  /** The fd budget: whether a VM of so many threads still fits (REGISTER, discovery). */
  fds: FdBudget;
  /** A file the privileged start-up created for writing (a plug-in's --record), when it did. */
  openedFile(path: string): number | undefined;
  /** A logger for a named area, at debug level when -T matches it. */
  area(name: string): Logger;
  onShutdown(hook: ShutdownHook): void;
  /**
   * Runs once the daemon listens and has dropped its privileges. A hook may return a promise of the
   * start-up work it began (a first scan): the start-up memory settle waits for it (at most
   * STARTUP_SETTLE_WAIT_MS).
   */
  onReady(hook: () => void | Promise<void>): void;
  /** Legacy requests by result and open connections, for the v2 service's HOST_UPDATE. */
  health: HealthSource;
}

export interface DaemonPlugin {
  name: string;
  setup(ctx: DaemonContext): void | { v2Handler?: V2Handler } | Promise<void | { v2Handler?: V2Handler }>;
}

export interface RunDaemonOptions {
  v2Handler?: V2Handler;
  onShutdown?: ShutdownHook[];
  plugins?: DaemonPlugin[];
  /** Default true: SIGTERM/SIGINT/SIGHUP stop the daemon and exit the process with 0. */
  handleSignals?: boolean;
  logger?: Logger;
  /** Why the helper did not re-execute itself to drop privileges ('re-executed' when it did). */
  reexec?: string;
  /** Set in the re-executed image: what the privileged steps opened before the exec. */
  inherited?: Inherited;
}

export interface RunningDaemon {
  server: HelperServer;
  /** Stops everything (idempotent); resolves once clean. */
  stop(reason?: string): Promise<void>;
}

/** '*' matches any run of characters; everything else is literal. */
export function areaMatches(patterns: readonly string[], area: string): boolean {
  return patterns.some((p) => new RegExp(`^${p.split('*').map(escapeRe).join('.*')}$`).test(area));
}

function escapeRe(s: string): string {
  return s.replace(/[.+?^${}()|[\]\\]/g, '\\$&');
}

export async function runDaemon(config: DaemonConfig, opts: RunDaemonOptions = {}): Promise<RunningDaemon> {
  const logger = opts.logger ?? createLogger(config.logLevel);
  const area = (name: string): Logger =>
    areaMatches(config.traceAreas, name) && logger.levelVal > 20 ? logger.child({ area: name }, { level: 'debug' }) : logger.child({ area: name });
  const hooks: ShutdownHook[] = [...(opts.onShutdown ?? [])];
  const notifier = new Notifier(process.env, (e) => area('systemd').warn({ err: e.message }, 'sd_notify failed'));
  const device = new MsrDevice(config.hostPaths.msrPathTemplate);
  let server: HelperServer | undefined;
  let legacy: LegacyService | undefined;
  let pidfile: Pidfile | undefined;
  const signals = new DisposableStore();

  const cleanup = async () => {
    if (server) await server.close().catch(() => {});
    server?.limiter.flush();
    legacy?.limiter.flush();
    for (const h of hooks) {
      try {
        await withTimeout(Promise.resolve(h()), 5000);
      } catch (e) {
        logger.error({ err: (e as Error).message }, 'shutdown hook failed');
      }
    }
    pidfile?.release();
    device.close();
    // Last, so a second signal during shutdown still finds our handler (stop is idempotent).
    signals.dispose();
  };

  // Signals are caught from the start: one arriving during start-up stops the daemon right after it.
  let current: RunningDaemon | undefined;
  let pendingSignal: NodeJS.Signals | undefined;
  const onSignal = (sig: NodeJS.Signals) => {
    if (!current) {
      pendingSignal = sig;
      return;
    }
    void current.stop(sig).then(() => process.exit(0));
  };
  if (opts.handleSignals !== false) {
    for (const sig of ['SIGTERM', 'SIGINT', 'SIGHUP'] as const) signals.add(listen(process, sig, () => onSignal(sig)));
  }

  try {
    const inh = opts.inherited;
    const activation = inh ? null : takeActivation();
    const target: ListenTarget = inh ? { fd: inh.listen } : activation ? { fd: activationFd(activation, config.socketPathGiven) } : { path: config.socketPath };
    const vendor = checkVendor(config.vendor, config.hostPaths.procRoot);
    const cpus = checkTopology(config.hostPaths.sysRoot);
    if (inh) {
      for (const [cpu, fd] of inh.msr) device.adopt(cpu, fd);
      if (inh.pidfile !== undefined) pidfile = pidfileOf(inh.pidfile);
    } else {
      checkPermission(config.hostPaths.msrPathTemplate);
      openMsrDevices(device, cpus);
    }
    logger.info({ vendor, cpus: cpus.length, packages: new Set(cpus.map((c) => c.package)).size }, 'MSR devices open');

    // Out of fds, accept() and /proc opens fail: use the whole hard limit, and budget it.
    const nofile = raiseFdLimit();
    const limit = nofile.after.soft === Infinity ? 1 << 20 : nofile.after.soft;
    const maxConnections = effectiveMaxConnections(config.maxConnections, limit, countOpenFds());
    const fds = new FdBudget({ limit, maxConnections, openConnections: () => server?.connections ?? 0 });
    logger.info({ before: nofile.before.soft, limit, hard: nofile.after.hard, maxConnections, err: nofile.error ?? null }, 'open-file limit');
    if (maxConnections < config.maxConnections) {
      logger.warn({ asked: config.maxConnections, maxConnections, limit }, `--max-connections lowered to ${maxConnections}: the open-file limit (${limit}) cannot hold more beside the VMs' fds; raise LimitNOFILE / ulimit -n`);
    }

    let v2Handler = opts.v2Handler;
    const files = new Map(inh?.files ?? []);
    const openedFile = (p: string) => files.get(p);
    const readyHooks: (() => void | Promise<void>)[] = [];
    const legacyCounters: LegacyCounters = newLegacyCounters();
    const health: HealthSource = { legacy: legacyCounters, connections: () => server?.connections ?? 0 };
    const ctx: DaemonContext = { config, vendor, cpus, device, logger, fds, openedFile, area, onShutdown: (h) => hooks.push(h), onReady: (h) => readyHooks.push(h), health };
    for (const p of opts.plugins ?? []) {
      const r = await p.setup(ctx);
      if (r && r.v2Handler) v2Handler = v2Handler ?? r.v2Handler;
    }

    ({ legacy, server } = assembleServer({
      paths: config.hostPaths,
      device,
      vendor,
      cpus,
      amd: config.amd,
      target,
      area,
      counters: legacyCounters,
      server: {
        maxConnections,
        socketMode: config.socketMode,
        ...(inh?.socket ? { ownedSocket: inh.socket } : {}),
        ...(config.socketGid !== undefined ? { socketGid: config.socketGid } : {}),
        incomplete: new IncompleteFrames({ ...DEFAULT_INCOMPLETE_LIMITS, deadlineMs: config.frameTimeoutMs }),
      },
      ...(v2Handler ? { v2Handler } : {}),
    }));
    await server.listen();
    if (!inh && (config.daemonize || config.pidfileGiven)) pidfile = acquirePidfile(config.pidfile);

    const privLog = area('privileges');
    // Re-executed: the drop happened before the exec, on every thread (privileges.ts, reexecDropped).
    const report = inh
      ? { skipped: [] }
      : dropPrivileges({
          ...(config.uid !== undefined ? { uid: config.uid } : {}),
          ...(config.gid !== undefined ? { gid: config.gid } : {}),
        });
    const st = parseProcStatus(fs.readFileSync('/proc/self/status', 'utf8'));
    privLog.info(
      { uid: st.uid, gid: st.gid, groups: st.groups, capEff: capHex(st.capEff), capPrm: capHex(st.capPrm), capBnd: capHex(st.capBnd), noNewPrivs: st.noNewPrivs, skipped: report.skipped, reexec: opts.reexec ?? null },
      'privileges dropped (main thread, from /proc/self/status)',
    );
    // The re-exec (privileges.ts) gives every thread the main thread's capabilities; a thread that
    // differs means it could not run (see reexec), and an operator should know which ones.
    const threads = describeThreads();
    const others = threads.filter((t) => t.tid !== process.pid && t.capEff !== capHex(st.capEff));
    if (others.length) privLog.warn({ threads: others, reexec: opts.reexec ?? null }, 'some threads hold other capabilities than the main thread (capabilities are per thread)');
    else privLog.debug({ threads: threads.length, capEff: capHex(st.capEff) }, 'every thread holds the main thread\'s capabilities');

    const where = 'path' in target ? target.path : inh?.socket ? inh.socket.path : `systemd socket (fd ${target.fd})`;
    logger.info({ socket: where }, `Listening on ${where}`);
    notifier.ready(`listening on ${where}`);
    const wd = notifier.startWatchdog();
    if (wd !== null) area('systemd').debug({ everyMs: wd }, 'watchdog keep-alive started');

    let stopping: Promise<void> | undefined;
    const running: RunningDaemon = {
      server,
      stop(reason = 'stop requested') {
        stopping ??= (async () => {
          logger.info({ reason }, 'shutting down');
          notifier.stopping();
          await cleanup();
          logger.info('stopped');
        })();
        return stopping;
      },
    };
    current = running;
    const startupWork = readyHooks.map((h) => h()).filter((w) => w instanceof Promise);
    if (isDaemonChild()) reportReady();
    settleAfterStartup(startupWork, () => stopping !== undefined, (r) => area('memory').info(r, 'memory given back after start-up'));
    if (pendingSignal) onSignal(pendingSignal);
    return running;
  } catch (e) {
    await cleanup();
    // A start-up failure before the server took over the socket bound before the exec.
    if (opts.inherited?.socket) removeOwnSocketFile(opts.inherited.socket, logger);
    throw e;
  }
}

/**
 * What start-up ran and read (most of the node binary's pages, its garbage) is not needed again:
 * settled at once, and again when the ready hooks' start-up work (a first scan, which leaves its
 * own garbage and free heap) is done or STARTUP_SETTLE_WAIT_MS passed. Reports RSS before the first
 * pass and after the last.
 */
function settleAfterStartup(work: Promise<void>[], stopped: () => boolean, report: (r: { rssBeforeMb: number; rssAfterMb: number }) => void): void {
  setImmediate(() => {
    if (stopped()) return;
    const first = settleOnce();
    if (work.length === 0) return report(first);
    let waited: NodeJS.Timeout | undefined;
    void Promise.race([Promise.allSettled(work), new Promise<void>((resolve) => (waited = setTimeout(resolve, STARTUP_SETTLE_WAIT_MS).unref()))]).then(() => {
      clearTimeout(waited);
      if (stopped()) return;
      report({ rssBeforeMb: first.rssBeforeMb, rssAfterMb: settleOnce().rssAfterMb });
    });
  }).unref();
}

function withTimeout<T>(p: Promise<T>, ms: number): Promise<T> {
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`timed out after ${ms} ms`)), ms);
    p.then(
      (v) => {
        clearTimeout(t);
        resolve(v);
      },
      (e) => {
        clearTimeout(t);
        reject(e);
      },
    );
  });
}
