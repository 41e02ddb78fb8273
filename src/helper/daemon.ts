/**
 * The daemon's life, one start-up path in one order (docs/daemon.md "Start-up, in order"): what is
 * inherited (Inherited: from systemd, from the image before the start-up re-exec) is adopted, the rest
 * opened (lifecycle/startup.ts: checks, MSR fds, listening socket, pidfile); then privileges dropped,
 * the service chain assembled with its plug-ins, served, READY. On SIGTERM/SIGINT: stop
 * accepting, close clients, run shutdown hooks, remove what we created. SIGHUP does not stop it
 * (os/sighup.ts).
 */
import fs from 'node:fs';
import { createLogger, type Logger } from '../logging/logger.js';
import { newLegacyCounters, type LegacyCounters, type LegacyService } from './legacy/legacy-service.js';
import type { HelperServer, V2Handler } from './server/server.js';
import { assembleServer } from './assemble-server.js';
import { isPreferredPeer } from '../os/preferred-owner.js';
import type { HealthSource } from './v2/service.js';
import { DisposableStore, listen } from '../common/disposable.js';
import { DEFAULT_INCOMPLETE_LIMITS, IncompleteFrames } from './server/incomplete-frames.js';
import { lateV2Handler } from './server/late-v2-handler.js';
import { countOpenFds, effectiveMaxConnections, FdBudget, raiseFdLimit } from '../os/fd-budget.js';
import { Notifier } from './lifecycle/systemd.js';
import { inheritFromEnvironment, type Inherited } from './lifecycle/inherited.js';
import { openStart, stepDone, type Opened, type StepDone } from './lifecycle/startup.js';
import type { DaemonConfig, DaemonContext, DaemonPlugin, RestartParticipant, ShutdownHook } from './lifecycle/config.js';
import { decodeHandedState, HANDOVER_NAMES, takeHandedOver } from './lifecycle/handed-over.js';
import { Restarter, takeRestartClock, wallMs } from './lifecycle/restart.js';
import { dropPrivileges } from '../os/privileges/capabilities.js';
import { capHex, describeThreads, parseProcStatus } from '../os/privileges/proc-status.js';
import { isDaemonChild, reportReady } from './lifecycle/daemonize.js';
import { settleOnce } from './lifecycle/memory-settler.js';
import { handleSighup } from '../os/sighup.js';
import { closeOpenInspector } from '../os/inspector-guard.js';

/** Longest wait for the ready hooks' start-up work before the start-up memory settle runs anyway. */
export const STARTUP_SETTLE_WAIT_MS = 2000;

export interface RunDaemonOptions {
  v2Handler?: V2Handler;
  onShutdown?: ShutdownHook[];
  plugins?: DaemonPlugin[];
  /** Default true: SIGTERM/SIGINT stop the daemon and exit the process with 0; SIGHUP is logged (os/sighup.ts). */
  handleSignals?: boolean;
  logger?: Logger;
  /** Why the helper did not re-execute itself to drop privileges ('re-executed' when it did). */
  reexec?: string;
  /**
   * What this start inherits (the re-executed image: everything the privileged steps opened before
   * the exec). Default: what the environment passes (systemd socket activation), else nothing.
   */
  inherited?: Inherited;
  /** Files plug-ins write (--record), created before the privilege drop (DaemonContext.openedFile). */
  files?: readonly string[];
}

export interface RunningDaemon {
  server: HelperServer;
  /** What each start-up step did (ran, adopted, not asked), once each, in order. */
  steps: readonly StepDone[];
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
  const enteredAt = wallMs();
  const clock = takeRestartClock();
  const logger = opts.logger ?? createLogger(config.logLevel);
  const area = (name: string): Logger =>
    areaMatches(config.traceAreas, name) && logger.levelVal > 20
      ? logger.child({ area: name }, { level: 'debug' })
      : logger.child({ area: name });
  const hooks: ShutdownHook[] = [...(opts.onShutdown ?? [])];
  const notifier = new Notifier(process.env, (e) => area('systemd').warn({ err: e.message }, 'sd_notify failed'));
  let opened: Opened | undefined;
  let server: HelperServer | undefined;
  let legacy: LegacyService | undefined;
  const signals = new DisposableStore();
  let restarter: Restarter | undefined;

  const cleanup = async () => {
    // The server closes the listener it serves; before serving, the listener is closed alone.
    if (server) await server.close().catch(() => {});
    else await opened?.listener.close(logger);
    server?.limiter.flush();
    legacy?.limiter.flush();
    for (const h of hooks) {
      try {
        await withTimeout(Promise.resolve(h()), 5000);
      } catch (e) {
        logger.error({ err: (e as Error).message }, 'shutdown hook failed');
      }
    }
    opened?.pidfile?.release();
    opened?.device.close();
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
    for (const sig of ['SIGTERM', 'SIGINT'] as const) signals.add(listen(process, sig, () => onSignal(sig)));
    // SIGHUP restarts in place (lifecycle/restart.ts); during start-up there is nothing to hand over yet.
    signals.add(
      handleSighup(logger, undefined, () =>
        restarter ? void restarter.inPlace('SIGHUP') : logger.warn('SIGHUP during start-up: no restart (the helper is not serving yet)'),
      ),
    );
  }

  try {
    // Checks, MSR fds, listening socket, pidfile, plug-ins' files: each adopted when inherited, else opened.
    const inh = opts.inherited ?? inheritFromEnvironment(config.socketPathGiven);
    const startLog = area('startup');
    opened = await openStart(config, inh, { files: opts.files ?? [], log: startLog });
    const openedAt = wallMs();
    const { vendor, cpus, device, listener, energy, energyWhy } = opened;
    const steps: StepDone[] = [...opened.steps];
    // What a restart handed over (connections, state, counters), each part checked; the rest closed.
    const handed = takeHandedOver(inh.named, area('restart'));
    // Named fds not from a restart in place came from systemd's fd store (as root through the start-up
    // re-exec, whose `how` is 'reexec'): taken, they leave the store, or systemd would hold them open.
    if (inh.how !== 'restart' && inh.named && inh.named.size > 0)
      for (const name of Object.values(HANDOVER_NAMES)) notifier.removeStoredFds(name);
    if (
      notifier.socket !== undefined &&
      process.env.FDSTORE !== '0' &&
      inh.how !== 'restart' &&
      !handed.state &&
      !handed.connections.length
    ) {
      area('restart').info(
        'a fresh start: systemd passed no restart state (its fd store is kept by systemctl restart, dropped by systemctl stop: ' +
          'any QEMU connections of a stopped helper were lost with it)',
      );
    }
    const openedWhat =
      energy === 'msr'
        ? 'MSR devices open'
        : energy === 'powercap'
          ? 'powercap zones open (no MSR device: legacy requests get 0)'
          : 'no MSR device (synthetic energy: legacy requests get 0)';
    logger.info(
      { vendor, energySource: energy, why: energyWhy, cpus: cpus.length, packages: new Set(cpus.map((c) => c.package)).size },
      openedWhat,
    );

    // The privilege drop. Re-executed: done before the exec, on every thread (os/privileges/reexec.ts).
    const privLog = area('privileges');
    const report = inh.dropped
      ? { skipped: [] }
      : dropPrivileges({
          ...(config.uid !== undefined ? { uid: config.uid } : {}),
          ...(config.gid !== undefined ? { gid: config.gid } : {}),
        });
    stepDone(steps, 'drop', inh.dropped ? 'adopted' : 'ran', inh.how, startLog);
    const st = parseProcStatus(fs.readFileSync('/proc/self/status', 'utf8'));
    privLog.info(
      {
        uid: st.uid,
        gid: st.gid,
        groups: st.groups,
        capEff: capHex(st.capEff),
        capPrm: capHex(st.capPrm),
        capBnd: capHex(st.capBnd),
        noNewPrivs: st.noNewPrivs,
        skipped: report.skipped,
        ...(opts.reexec !== undefined ? { reexec: opts.reexec } : {}),
      },
      'privileges dropped (main thread, from /proc/self/status)',
    );
    // The re-exec (privileges.ts) gives every thread the main thread's capabilities; a thread that
    // differs means it could not run (see reexec), and an operator should know which ones.
    const threads = describeThreads();
    const others = threads.filter((t) => t.tid !== process.pid && t.capEff !== capHex(st.capEff));
    if (others.length)
      privLog.warn(
        { threads: others, ...(opts.reexec !== undefined ? { reexec: opts.reexec } : {}) },
        'some threads hold other capabilities than the main thread (capabilities are per thread)',
      );
    else privLog.debug({ threads: threads.length, capEff: capHex(st.capEff) }, "every thread holds the main thread's capabilities");

    // Out of fds, accept() and /proc opens fail: use the whole hard limit, and budget it.
    const nofile = raiseFdLimit();
    const limit = nofile.after.soft === Infinity ? 1 << 20 : nofile.after.soft;
    const maxConnections = effectiveMaxConnections(config.maxConnections, limit, countOpenFds());
    const fds = new FdBudget({ limit, maxConnections, openConnections: () => server?.connections ?? 0 });
    logger.info(
      // Only a failure has an err: no `err: null` on every start.
      {
        before: nofile.before.soft,
        limit,
        hard: nofile.after.hard,
        maxConnections,
        ...(nofile.error !== undefined ? { err: nofile.error } : {}),
      },
      'open-file limit',
    );
    if (maxConnections < config.maxConnections) {
      logger.warn(
        { asked: config.maxConnections, maxConnections, limit },
        `--max-connections lowered to ${maxConnections}: the open-file limit (${limit}) cannot hold more beside the VMs' fds; raise LimitNOFILE / ulimit -n`,
      );
    }

    // The service chain: the legacy service and the server on the listener, serving at once (a
    // restart's legacy connections need no v2 state); then the plug-ins (the v2 service, which restores
    // the state), whose v2 handler is bound late: a v2 connection meanwhile waits (late-v2-handler.ts).
    const late = opts.v2Handler || (opts.plugins ?? []).length > 0 ? lateV2Handler() : undefined;
    const files = opened.files;
    const openedFile = (p: string) => files.get(p);
    const readyHooks: (() => void | Promise<void>)[] = [];
    const legacyCounters: LegacyCounters = { ...newLegacyCounters(), ...handed.legacy };
    const participants: RestartParticipant[] = [];
    const health: HealthSource = { legacy: legacyCounters, connections: () => server?.connections ?? 0 };
    const powercapFds = opened.powercap;
    const pluginsAt = wallMs();
    ({ legacy, server } = assembleServer({
      paths: config.hostPaths,
      device,
      vendor,
      cpus,
      amd: config.amd,
      ...(energy !== 'msr' ? { noMsrs: `the daemon reads energy from ${energy}, not from MSR devices` } : {}),
      listener,
      area,
      counters: legacyCounters,
      // Only a restart has QEMUs mid-window whose counters the state holds; a fresh start answers raw.
      holdEnergyStatus: config.holdEnergyStatus === true && handed.state !== undefined,
      server: {
        maxConnections,
        // Root and the socket's group (every QEMU) are bound by --max-connections only; other users by their share.
        preferredPeer: (peer) => isPreferredPeer(config.hostPaths.procRoot, peer, config.socketGid !== undefined ? [config.socketGid] : []),
        incomplete: new IncompleteFrames({ ...DEFAULT_INCOMPLETE_LIMITS, deadlineMs: config.frameTimeoutMs }),
      },
      ...(late ? { v2Handler: late.handler } : {}),
    }));
    server.serve();
    server.adopt(handed.connections);
    const servingAt = wallMs();
    // The requests that waited through a restart are read and answered first; then the state is decoded.
    await afterIoPoll();
    const restored = handed.state && decodeHandedState(handed.state, area('restart'));
    const ctx: DaemonContext = {
      config,
      vendor,
      cpus,
      device,
      energySource: energy,
      powercapFd: (p) => powercapFds.get(p),
      logger,
      fds,
      openedFile,
      area,
      onShutdown: (h) => hooks.push(h),
      onReady: (h) => readyHooks.push(h),
      health,
      ...(restored ? { restored } : {}),
      restarted: inh.how === 'restart' || restored !== undefined,
      onRestart: (p) => void participants.push(p),
      answerEnergyStatus: (hook) => legacy?.setEnergyStatus(hook) ?? new Map(),
    };
    let v2Handler = opts.v2Handler;
    for (const p of opts.plugins ?? []) {
      const r = await p.setup(ctx);
      if (r && r.v2Handler) v2Handler = v2Handler ?? r.v2Handler;
    }
    const v2Log = area('server');
    late?.bind(
      v2Handler ??
        ((socket, peer) => {
          v2Log.warn({ peer: peer.pid }, 'a v2 client, and no v2 service: closing the connection');
          socket.destroy();
        }),
    );
    if (clock !== null && inh.how === 'restart') {
      // Where a restart in place spends its time, old image to serving (docs/daemon.md "Restarts").
      const ms = (a: number, b: number) => Math.round((b - a) * 10) / 10;
      const node = performance.nodeTiming;
      area('restart').info(
        {
          checkMs: ms(clock.signalAt, clock.stoppedAt),
          drainAndSaveMs: ms(clock.stoppedAt, clock.execAt),
          execToNodeMs: ms(clock.execAt, performance.timeOrigin),
          nodeBootMs: ms(0, node.bootstrapComplete),
          modulesMs: ms(performance.timeOrigin + node.bootstrapComplete, enteredAt),
          startupMs: ms(enteredAt, openedAt),
          handoverMs: ms(openedAt, pluginsAt),
          serveMs: ms(pluginsAt, servingAt),
          stoppedToServingMs: ms(clock.stoppedAt, servingAt),
          servicesMs: ms(servingAt, wallMs()),
        },
        'restart phases',
      );
    }
    restarter = new Restarter({ server, opened, participants, legacy: legacyCounters, notifier, log: area('restart') });

    const where = listener.where;
    logger.info({ socket: where }, `Listening on ${where}`);
    notifier.ready(`listening on ${where}`);
    // Defence in depth (os/inspector-guard.ts): nothing may leave a debugger open in the daemon.
    const inspectorUrl = closeOpenInspector();
    if (inspectorUrl !== null)
      logger.warn({ inspector: inspectorUrl }, "Node's inspector was open: closed (a debugger must not reach the daemon)");
    const wd = notifier.startWatchdog();
    if (wd !== null) area('systemd').debug({ everyMs: wd }, 'watchdog keep-alive started');

    let stopping: Promise<void> | undefined;
    const running: RunningDaemon = {
      server,
      steps,
      stop(reason = 'stop requested') {
        stopping ??= (async () => {
          logger.info({ reason }, 'shutting down');
          // Under systemd, what a restart carries goes to the fd store first (dropped by systemd on a plain stop).
          if (reason === 'SIGTERM' || reason === 'SIGINT') await restarter?.toFdStore();
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
    settleAfterStartup(
      startupWork,
      () => stopping !== undefined,
      (r) => area('memory').info(r, 'memory given back after start-up'),
    );
    if (pendingSignal) onSignal(pendingSignal);
    return running;
  } catch (e) {
    await cleanup();
    throw e;
  }
}

/**
 * What start-up ran and read (most of the node binary's pages, its garbage) is not needed again:
 * settled at once, and again when the ready hooks' start-up work (a first scan, which leaves its
 * own garbage and free heap) is done or STARTUP_SETTLE_WAIT_MS passed. Reports RSS before the first
 * pass and after the last.
 */
function settleAfterStartup(
  work: Promise<void>[],
  stopped: () => boolean,
  report: (r: { rssBeforeMb: number; rssAfterMb: number }) => void,
): void {
  setImmediate(() => {
    if (stopped()) return;
    const first = settleOnce();
    if (work.length === 0) return report(first);
    let waited: NodeJS.Timeout | undefined;
    void Promise.race([
      Promise.allSettled(work),
      new Promise<void>((resolve) => (waited = setTimeout(resolve, STARTUP_SETTLE_WAIT_MS).unref())),
    ]).then(() => {
      clearTimeout(waited);
      if (stopped()) return;
      report({ rssBeforeMb: first.rssBeforeMb, rssAfterMb: settleOnce().rssAfterMb });
    });
  }).unref();
}

/**
 * Resolves once the event loop has polled for I/O: an immediate set in the poll phase runs before the
 * next poll, so the second one runs after it.
 */
function afterIoPoll(): Promise<void> {
  return new Promise((resolve) => setImmediate(() => setImmediate(resolve)));
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
