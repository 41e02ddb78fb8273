/** The phases of the daemon's start, in the order Daemon.start runs them (docs/daemon.md "Start-up, in order"). */
import { ignoreSentFaults, startLoopWatchdog } from './loop-watchdog.js';
import fs from 'node:fs';
import type { Logger } from '../../logging/logger.js';
import { LegacyService, newLegacyCounters, OnlineCpus } from '../legacy/legacy-service.js';
import { HelperServer, type lateV2Handler } from '../server/server.js';
import { readStarttime } from '../../os/proc-starttime.js';
import { isQemuPeer } from '../../discovery/qemu-peer.js';
import { IncompleteFrames } from '../server/incomplete-frames.js';
import { DEFAULT_INCOMPLETE_LIMITS } from '../server/listener.js';
import { countOpenFds, effectiveMaxConnections, FdBudget, raiseFdLimit } from '../../budget/fd-budget.js';
import { dropPrivileges } from '../../os/privileges/capabilities.js';
import { capHex, describeThreads, parseProcStatus } from '../../os/privileges/proc-status.js';
import { closeOpenInspector } from '../../os/inspector-guard.js';
import type { RestartClock } from '../handover/restarter.js';
import type { DaemonConfig } from './config.js';
import type { Inherited } from '../handover/inherited.js';
import { openStart, stepDone, type Opened, type StepDone } from './startup.js';
import type { Notifier } from './systemd.js';
import { CrashGuard, type Kept } from '../handover/kept.js';
import type { ConnectionKeep } from '../handover/frozen.js';

type Areas = (name: string) => Logger;

/** The start-up steps, each adopted when inherited, else opened; then what the process before kept, each part checked. */
export async function open(
  config: DaemonConfig,
  inh: Inherited,
  o: { files: readonly string[]; area: Areas; logger: Logger; notifier: Notifier },
): Promise<{ opened: Opened; guard: CrashGuard }> {
  const opened = await openStart(config, inh, { files: o.files, log: o.area('startup') });
  const guard = new CrashGuard(inh.named, o.notifier, o.area('restart'));
  const handed = guard.kept;
  if (guard.keep?.holder === 'fd store' && inh.how !== 'restart' && !handed.state && !handed.connections.length) {
    o.area('restart').info(
      'a fresh start: systemd passed no restart state (its fd store is kept by systemctl restart, dropped by systemctl stop: ' +
        'any QEMU connections of a stopped helper were lost with it)',
    );
  }
  const { vendor, cpus, energy, energyWhy } = opened;
  const openedWhat = {
    msr: 'MSR devices open',
    powercap: 'powercap zones open (no MSR device: legacy requests get 0)',
    synthetic: 'no MSR device (synthetic energy: legacy requests get 0)',
  };
  o.logger.info(
    { vendor, energySource: energy, why: energyWhy, cpus: cpus.length, packages: new Set(cpus.map((c) => c.pkg)).size },
    openedWhat[energy],
  );
  return { opened, guard };
}

/** The privilege drop (re-executed: before the exec), each thread's credentials logged (one that differs: the re-exec could not run). */
export function drop(config: DaemonConfig, inh: Inherited, steps: StepDone[], o: { area: Areas; reexec?: string }): void {
  const privLog = o.area('privileges');
  const report = inh.dropped ? { skipped: [] } : dropPrivileges({ uid: config.uid, gid: config.gid });
  stepDone(steps, 'drop', inh.dropped ? 'adopted' : 'ran', inh.how, o.area('startup'));
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
      reexec: o.reexec,
    },
    'privileges dropped (main thread, from /proc/self/status)',
  );
  if (config.uid !== undefined && config.uid !== 0) warnSharedUid(config.uid, privLog);
  const threads = describeThreads();
  const others = threads.filter((t) => t.tid !== process.pid && t.capEff !== capHex(st.capEff));
  if (others.length)
    privLog.warn(
      { threads: others, reexec: o.reexec },
      'some threads hold other capabilities than the main thread (capabilities are per thread)',
    );
  else privLog.debug({ threads: threads.length, capEff: capHex(st.capEff) }, "every thread holds the main thread's capabilities");
}

/** Any process of -u's user may signal the serving process (docs/security.md "The -u user ending the service"): said when one runs. */
function warnSharedUid(uid: number, log: Logger): void {
  let count = 0;
  let example: { pid: number; comm: string } | undefined;
  for (const name of fs.readdirSync('/proc')) {
    const pid = Number(name);
    if (!Number.isInteger(pid) || pid === process.pid || pid === process.ppid) continue;
    try {
      const st = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
      const ids = /^Uid:\s+(\d+)\s+(\d+)/m.exec(st);
      if (ids === null || (Number(ids[1]) !== uid && Number(ids[2]) !== uid)) continue;
      count++;
      example ??= { pid, comm: /^Name:\s*(.*)$/m.exec(st)?.[1] ?? '?' };
    } catch {
      /* gone */
    }
  }
  if (count > 0)
    log.warn(
      { uid, processes: count, example },
      `the helper's user (uid ${uid}) runs ${count} other process(es), e.g. ${example!.comm} (pid ${example!.pid}): any of them may signal the serving process and end it (a restart); fix: give the helper a user of its own (-u)`,
    );
}

/** Out of fds, accept() and /proc opens fail: the whole hard limit used, and budgeted. */
export function budgetFds(config: DaemonConfig, openConnections: () => number, logger: Logger): { fds: FdBudget; maxConnections: number } {
  const nofile = raiseFdLimit();
  const limit = nofile.after.soft === Infinity ? 1 << 20 : nofile.after.soft;
  const maxConnections = effectiveMaxConnections(config.maxConnections, limit, countOpenFds());
  const fds = new FdBudget({ limit, maxConnections, openConnections });
  logger.info(
    // Only a failure has an err (pino leaves an undefined one out).
    { before: nofile.before.soft, limit, hard: nofile.after.hard, maxConnections, err: nofile.error },
    'open-file limit',
  );
  if (maxConnections < config.maxConnections) {
    logger.warn(
      { asked: config.maxConnections, maxConnections, limit },
      `--max-connections lowered to ${maxConnections}: the open-file limit (${limit}) cannot hold more beside the VMs' fds; raise LimitNOFILE / ulimit -n`,
    );
  }
  return { fds, maxConnections };
}

/** The legacy service and the server (which hands v2 connections to `late` once the v2 service is made), serving at once. */
export function serveLegacy(
  config: DaemonConfig,
  opened: Opened,
  handed: Kept,
  o: { maxConnections: number; area: Areas; late?: ReturnType<typeof lateV2Handler>; keep?: ConnectionKeep },
) {
  const { procRoot, sysRoot } = config.hostPaths;
  const legacy = new LegacyService({
    device: opened.device,
    vendor: opened.vendor,
    procRoot,
    cpus: new OnlineCpus(
      sysRoot,
      opened.cpus.map((c) => c.cpu),
    ),
    amd: config.amd,
    noMsrs: opened.energy !== 'msr' ? `the daemon reads energy from ${opened.energy}, not from MSR devices` : undefined,
    logger: o.area('legacy'),
    counters: { ...newLegacyCounters(), ...handed.legacy },
    // Only a restart (or a crash's checkpoint) has QEMUs mid-window whose counters the state holds; a fresh start answers raw.
    holdEnergyStatus: config.holdEnergyStatus === true && handed.state !== undefined,
  });
  const server = new HelperServer({
    listener: opened.listener,
    legacy,
    logger: o.area('server'),
    starttimeOf: (pid) => readStarttime(procRoot, pid),
    maxConnections: o.maxConnections,
    // Root is bound by --max-connections only, every other user by its share; QEMU processes of the socket's group come first.
    preferredPeer: (peer) => peer.uid === 0,
    qemuPeer: (peer) => isQemuPeer(procRoot, peer, config.socketGid !== undefined ? [config.socketGid] : []),
    incomplete: new IncompleteFrames({ ...DEFAULT_INCOMPLETE_LIMITS, deadlineMs: config.frameTimeoutMs }),
    busyPollMaxUs: config.busyPollMaxUs,
    keep: o.keep,
    v2Handler: o.late?.handler,
  });
  server.serve();
  server.adopt(handed.connections);
  return { legacy, server };
}

/** Serving: said in the log and to systemd (READY, the watchdog); nothing may leave a debugger open. */
export function ready(where: string, o: { logger: Logger; area: Areas; notifier: Notifier }): void {
  o.logger.info({ socket: where }, `Listening on ${where}`);
  o.notifier.ready(`listening on ${where}`);
  const inspectorUrl = closeOpenInspector();
  if (inspectorUrl !== null)
    o.logger.warn({ inspector: inspectorUrl }, "Node's inspector was open: closed (a debugger must not reach the daemon)");
  ignoreSentFaults();
  startLoopWatchdog();
  const wd = o.notifier.startWatchdog();
  if (wd !== null) o.area('systemd').debug({ everyMs: wd }, 'watchdog keep-alive started');
}

/** Wall-clock times (ms) of the start's phases, for the restart's timing (handover: before the server was made). */
export type PhaseTimes = Record<'entered' | 'opened' | 'handover' | 'serving', number>;

/** Where a restart in place spends its time, old image to serving (docs/daemon.md "Restarts"). */
export function logRestartPhases(clock: RestartClock, t: PhaseTimes, servicesDone: number, log: Logger): void {
  const ms = (a: number, b: number) => Math.round((b - a) * 10) / 10;
  const node = performance.nodeTiming;
  log.info(
    {
      checkMs: ms(clock.signalAt, clock.stoppedAt),
      drainAndSaveMs: ms(clock.stoppedAt, clock.execAt),
      execToNodeMs: ms(clock.execAt, performance.timeOrigin),
      nodeBootMs: ms(0, node.bootstrapComplete),
      modulesMs: ms(performance.timeOrigin + node.bootstrapComplete, t.entered),
      startupMs: ms(t.entered, t.opened),
      handoverMs: ms(t.opened, t.handover),
      serveMs: ms(t.handover, t.serving),
      stoppedToServingMs: ms(clock.stoppedAt, t.serving),
      servicesMs: ms(t.serving, servicesDone),
    },
    'restart phases',
  );
}
