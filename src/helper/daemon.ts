/** The composition root: Daemon.start() runs lifecycle/phases.ts in order, holds what they made and the restart contract, stops them. */
import { createLogger, type Logger } from '../logging/logger.js';
import type { assembleDaemonV2, V2DaemonSettings } from './assemble.js';
import { DisposableStore, listen } from '../common/disposable.js';
import { cannot } from '../common/errors.js';
import { lateV2Handler, type HelperServer } from './server/server.js';
import { inheritFromEnvironment, Notifier } from './lifecycle/systemd.js';
import type { Inherited } from './handover/inherited.js';
import type { Opened, StepDone } from './lifecycle/startup.js';
import type { DaemonConfig } from './lifecycle/config.js';
import type { Restartable } from './handover/frozen.js';
import { Restarter, takeRestartClock, wallMs } from './handover/restarter.js';
import { budgetFds, drop, logRestartPhases, open, ready, serveLegacy, type PhaseTimes } from './lifecycle/phases.js';
import { isDaemonChild, reportReady } from './lifecycle/daemonize.js';
import { settleOnce } from './server/memory-settler.js';
import { disarmLoopWatchdog, startLoopWatchdog, tellLoopBeats } from './lifecycle/loop-watchdog.js';
import { handleSighup } from '../os/sighup.js';
import type { StateSnapshot } from '../state/snapshot.js';
import type { CrashGuard } from './handover/kept.js';

/** Longest wait for the v2 service's start-up work before the start-up memory settle runs anyway. */
const STARTUP_SETTLE_WAIT_MS = 2000;
const V2_CLOSE_TIMEOUT_MS = 5000;

interface DaemonOptions {
  /** The v2 service's settings (the command line's); absent: no v2 service, v2 connections are read as legacy. */
  v2?: V2DaemonSettings;
  /** Default true: SIGTERM/SIGINT stop the daemon and exit the process with 0; SIGHUP restarts it in place (os/sighup.ts). */
  handleSignals?: boolean;
  logger?: Logger;
  /** Why the helper did not re-execute itself to drop privileges ('re-executed' when it did). */
  reexec?: string;
  /** What this start inherits (the re-executed image's); default: what systemd passes, else nothing. */
  inherited?: Inherited;
  /** Files the v2 service writes (--record), created before the privilege drop. */
  files?: readonly string[];
}

interface RunningDaemon {
  server: HelperServer;
  steps: readonly StepDone[];
  /** Stops everything (idempotent); resolves once clean. */
  stop(reason?: string): Promise<void>;
}

/** '*' matches any run of characters; everything else is literal. */
export function areaMatches(patterns: readonly string[], area: string): boolean {
  const literal = (s: string) => s.replace(/[.+?^${}()|[\]\\]/g, '\\$&');
  return patterns.some((p) => new RegExp(`^${p.split('*').map(literal).join('.*')}$`).test(area));
}

export function runDaemon(config: DaemonConfig, opts: DaemonOptions = {}): Promise<RunningDaemon> {
  return new Daemon(config, opts).start();
}

class Daemon implements Restartable {
  private readonly logger: Logger;
  private readonly notifier: Notifier;
  private readonly signals = new DisposableStore();
  private opened: Opened | undefined;
  private chain: ReturnType<typeof serveLegacy> | undefined;
  private v2: Awaited<ReturnType<typeof assembleDaemonV2>> | undefined;
  private restarter: Restarter | undefined;
  /** What is kept outside this process for a crash (handover/kept.ts), once opened. */
  private guard: CrashGuard | undefined;
  private running: RunningDaemon | undefined;
  /** A signal that came during start-up: it stops the daemon right after it. */
  private pendingSignal: NodeJS.Signals | undefined;
  private stopping: Promise<void> | undefined;

  constructor(
    private readonly config: DaemonConfig,
    private readonly opts: DaemonOptions = {},
  ) {
    this.logger = opts.logger ?? createLogger(config.logLevel);
    this.notifier = new Notifier(process.env, (e) => this.area('systemd').warn({ err: e.message }, 'sd_notify failed'));
  }

  /** A logger for a named area, at debug level when -T matches it. */
  readonly area = (name: string): Logger =>
    areaMatches(this.config.traceAreas, name) && this.logger.levelVal > 20
      ? this.logger.child({ area: name }, { level: 'debug' })
      : this.logger.child({ area: name });

  /** The start, phase by phase; a failure closes everything made so far and throws. */
  async start(): Promise<RunningDaemon> {
    const entered = wallMs();
    const clock = takeRestartClock();
    const { config, area, logger, notifier } = this;
    this.catchSignals();
    try {
      const inh = this.opts.inherited ?? inheritFromEnvironment(config.socketPathGiven);
      const { opened, guard } = await open(config, inh, { files: this.opts.files ?? [], area, logger, notifier });
      this.opened = opened;
      this.guard = guard;
      const times: PhaseTimes = { entered, opened: wallMs(), handover: 0, serving: 0 };
      const steps: StepDone[] = [...opened.steps];
      drop(config, inh, steps, { area, reexec: this.opts.reexec });
      const { fds, maxConnections } = budgetFds(config, () => this.chain?.server.connections ?? 0, logger);
      times.handover = wallMs();
      const late = this.opts.v2 ? lateV2Handler() : undefined;
      const chain = (this.chain = serveLegacy(config, opened, guard.kept, { maxConnections, area, late, keep: guard.keep }));
      times.serving = wallMs();
      const restored = await guard.restore();
      if (this.opts.v2) {
        // Loaded only now: QEMU's replies do not wait for the v2 service's modules (docs/daemon.md "Where the time goes").
        const { assembleDaemonV2 } = await import('./assemble.js');
        this.v2 = await assembleDaemonV2(this.opts.v2, {
          config,
          opened,
          fds,
          health: { legacy: chain.legacy.counters, connections: () => chain.server.connections },
          restarted: inh.how === 'restart' || restored !== undefined,
          area,
          answerEnergyStatus: (hook) => chain.legacy.setEnergyStatus(hook),
          restored,
        });
        late?.bind(this.v2.service.handler);
      }
      if (clock !== null && inh.how === 'restart') logRestartPhases(clock, times, wallMs(), area('restart'));
      this.restarter = new Restarter({
        daemon: this,
        opened,
        legacy: this.chain.legacy.counters,
        notifier,
        watchdog: { disarm: disarmLoopWatchdog, start: startLoopWatchdog },
        ...(guard.keep ? { keep: guard.keep } : {}),
        log: area('restart'),
      });
      if (guard.keep) tellLoopBeats(() => guard.keep!.beat());
      ready(opened.listener.where, { logger, area, notifier });
      // Checkpoints from now on, each written after its sample and before any client is told of it.
      guard.serving(this.v2?.service);
      return this.serving(steps);
    } catch (e) {
      await this.cleanup();
      throw e;
    }
  }

  /** The restart contract (Restartable): the server's connections stop being read, the v2 clients are told. */
  freeze(): ReturnType<Restartable['freeze']> {
    const server = this.chain!.server.freeze();
    const v2 = this.v2?.service.freeze();
    return {
      connections: () => server.connections(),
      get drained() {
        return v2?.drained ?? true;
      },
      thaw: () => {
        server.thaw();
        v2?.thaw();
      },
    };
  }

  snapshot(): StateSnapshot {
    if (this.v2 === undefined) throw new Error(cannot('restart', 'no part of the daemon gives its live state', 'report it'));
    return this.v2.service.snapshot();
  }

  /** Serving: the handle the caller stops it with; the v2 service's first scan, then memory given back. */
  private serving(steps: readonly StepDone[]): RunningDaemon {
    this.running = { server: this.chain!.server, steps, stop: (reason) => this.stop(reason) };
    const firstScan = this.v2?.ready();
    if (isDaemonChild()) reportReady();
    this.settleAfterStartup(firstScan);
    if (this.pendingSignal) this.onSignal(this.pendingSignal);
    return this.running;
  }

  /** What start-up ran and read is not needed again: memory settled at once, and again after the first scan (or the wait); RSS reported. */
  private settleAfterStartup(firstScan: Promise<void> | undefined): void {
    const report = (r: { rssBeforeMb: number; rssAfterMb: number }) => this.area('memory').info(r, 'memory given back after start-up');
    setImmediate(() => {
      if (this.stopping !== undefined) return;
      const first = settleOnce();
      if (firstScan === undefined) return report(first);
      let waited: NodeJS.Timeout | undefined;
      void Promise.race([
        Promise.allSettled([firstScan]),
        new Promise<void>((resolve) => (waited = setTimeout(resolve, STARTUP_SETTLE_WAIT_MS).unref())),
      ]).then(() => {
        clearTimeout(waited);
        if (this.stopping === undefined) report({ rssBeforeMb: first.rssBeforeMb, rssAfterMb: settleOnce().rssAfterMb });
      });
    }).unref();
  }

  private stop(reason = 'stop requested'): Promise<void> {
    this.stopping ??= (async () => {
      this.logger.info({ reason }, 'shutting down');
      // Connections closed from now on stay held outside (the fd store's hand-over, a stop).
      this.guard?.stopping();
      // Under systemd, what a restart carries goes to the fd store first (dropped by systemd on a plain stop).
      if (reason === 'SIGTERM' || reason === 'SIGINT') await this.restarter?.toFdStore();
      this.notifier.stopping();
      await this.cleanup();
      this.logger.info('stopped');
    })();
    return this.stopping;
  }

  private catchSignals(): void {
    if (this.opts.handleSignals === false) return;
    for (const sig of ['SIGTERM', 'SIGINT'] as const) this.signals.add(listen(process, sig, () => this.onSignal(sig)));
    // SIGHUP restarts in place (handover/restarter.ts); during start-up there is nothing to hand over yet.
    this.signals.add(
      handleSighup(this.logger, undefined, () =>
        this.restarter
          ? void this.restarter.inPlace('SIGHUP')
          : this.logger.warn('SIGHUP during start-up: no restart (the helper is not serving yet)'),
      ),
    );
  }

  private onSignal(sig: NodeJS.Signals): void {
    if (!this.running) {
      this.pendingSignal = sig;
      return;
    }
    void this.running.stop(sig).then(() => process.exit(0));
  }

  /** Closes what the start made, in order: the server (before serving: the listener alone), the v2 service, the start-up's fds. */
  private async cleanup(): Promise<void> {
    const { chain, opened, logger } = this;
    if (chain) await chain.server.close().catch(() => {});
    else await opened?.listener.close(logger);
    chain?.server.limiter.flush();
    chain?.legacy.limiter.flush();
    if (this.v2) {
      let timer: NodeJS.Timeout | undefined;
      const late = new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`timed out after ${V2_CLOSE_TIMEOUT_MS} ms`)), V2_CLOSE_TIMEOUT_MS);
      });
      try {
        await Promise.race([this.v2.close(), late]);
      } catch (e) {
        logger.error({ err: (e as Error).message }, 'shutdown hook failed');
      } finally {
        clearTimeout(timer);
      }
    }
    opened?.pidfile?.release();
    opened?.device.close();
    // Last, so a second signal during shutdown still finds our handler (stop is idempotent).
    this.signals.dispose();
  }
}
