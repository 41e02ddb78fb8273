/**
 * Restarts that QEMU does not see (docs/daemon.md "Restarts"). Both ways hand the next process the
 * same things: every legacy connection (and every one whose protocol is not known yet) with the bytes
 * read of it and not answered, the legacy counters (a handover record, record.ts), and the live
 * state (the snapshot, codec.ts), each memfd sealed. v2 clients are told the helper restarts (ERROR
 * RESTARTING) and reconnect; their registrations wait for them in the state.
 *
 *  - In place (SIGHUP, `vmsr-helper reload`): the installed binary is checked (it must run
 *    `--version`), then the daemon stops reading, hands over and executes it again in this process,
 *    as the start-up re-exec does; the listening socket, MSR fds and pidfile cross as at start-up. A
 *    failed check or exec leaves this process serving, every connection read again.
 *  - Through systemd's fd store (a stop under a NOTIFY_SOCKET): the same parts are stored with
 *    FDSTORE=1 under HANDOVER_NAMES, and the next start of the service gets them in LISTEN_FDS.
 */
import { disarmLoopWatchdog, startLoopWatchdog } from '../lifecycle/loop-watchdog.js';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import type { Logger } from '../../logging/logger.js';
import type { FrozenConnection, Restartable } from './frozen.js';
import type { LegacyCounters } from '../legacy/legacy-service.js';
import type { Opened } from '../lifecycle/startup.js';
import { HANDOVER_NAMES } from './handed-over.js';
import { RestartRequests } from './restart-requests.js';
import { inheritEnv, inheritedFds, type Inherited } from './inherited.js';
import type { Notifier } from '../lifecycle/systemd.js';
import { allowedEnvironment, daemonArgv, reexecInPlace, withDaemonNodeFlags } from '../../os/privileges/reexec.js';
import { closeFd, closeOnExec } from '../../os/libc/fds.js';
import { MAX_FDS_PER_MESSAGE } from '../../os/libc/sockets.js';
import { writeSealedMemfd, writeStateMemfd } from '../../state/memfd.js';
import { encodeHandover } from './handover-record.js';
import { monotonicNs } from '../../sampling/tick-loop.js';
import { cannot } from '../../common/errors.js';

/**
 * Longest wait, once reading stopped, for replies already queued and for v2 clients' last frames to
 * go out. A legacy connection whose replies still wait after it (its client reads none of them) is
 * closed rather than handed over: the unsent part of a queued reply cannot be known.
 */
const RESTART_DRAIN_MS = 200;
/** Longest the check of the installed binary (`--version`) may take before the restart is called off. */
const RESTART_CHECK_TIMEOUT_MS = 10_000;
export const HANDOVER_MEMFD_NAME = 'vmsr-helper-handover';
/**
 * Carries the old image's times (wall-clock ms, sub-ms: performance.timeOrigin + now) across the exec,
 * as JSON `{ signalAt, stoppedAt, execAt }`, for the new image's `restart phases` log line.
 */
export const RESTART_CLOCK_ENV = 'VMSR_HELPER_RESTART_CLOCK';
export interface RestartClock {
  signalAt: number;
  stoppedAt: number;
  execAt: number;
}
export const wallMs = (): number => performance.timeOrigin + performance.now();

/** The old image's times the exec carried (removed from the environment), or null. */
export function takeRestartClock(env: NodeJS.ProcessEnv = process.env): RestartClock | null {
  const text = env[RESTART_CLOCK_ENV];
  delete env[RESTART_CLOCK_ENV];
  if (text === undefined) return null;
  try {
    const v = JSON.parse(text) as Partial<RestartClock>;
    const ok = [v.signalAt, v.stoppedAt, v.execAt].every((x) => typeof x === 'number' && Number.isFinite(x));
    return ok ? (v as RestartClock) : null;
  } catch {
    return null;
  }
}

interface RestartParts {
  /** The running daemon: freeze() and snapshot(), the one restart contract. */
  daemon: Restartable;
  opened: Opened;
  legacy: LegacyCounters;
  notifier: Notifier;
  log: Logger;
}

/** What is handed over, ready: the memfds and the connections' fds; `undo` closes the memfds and reads again. */
interface Prepared {
  stateFd: number;
  recordFd: number;
  connections: FrozenConnection[];
  connFds: number[];
  undo(): void;
}

function fdOf(s: FrozenConnection['socket']): number | undefined {
  const fd = (s as unknown as { _handle?: { fd?: unknown } })._handle?.fd;
  return typeof fd === 'number' && fd >= 0 ? fd : undefined;
}

async function until(done: () => boolean, ms: number): Promise<void> {
  const end = Date.now() + ms;
  while (!done() && Date.now() < end) await new Promise((r) => setTimeout(r, 2));
}

/**
 * Stops reading, tells v2 clients, waits (at most RESTART_DRAIN_MS) for queued replies, then, with
 * no turn of the event loop until the caller execs or stores: the state and the record in sealed
 * memfds. Throws (everything read again) when the state cannot be taken.
 */
async function prepare(p: RestartParts): Promise<Prepared> {
  const frozen = p.daemon.freeze();
  const legacyQueued = () => frozen.connections().some((c) => c.kind === 'legacy' && c.socket.writableLength > 0);
  await until(() => frozen.drained && !legacyQueued(), RESTART_DRAIN_MS);
  const abort = () => frozen.thaw();
  let stateFd = -1;
  try {
    const connections = frozen.connections().filter((c) => {
      if (c.kind !== 'legacy' || c.socket.writableLength === 0) return fdOf(c.socket) !== undefined;
      p.log.warn(
        { queuedBytes: c.socket.writableLength },
        'a legacy client reads none of its replies: its connection is closed, not handed over',
      );
      c.socket.destroy();
      return false;
    });
    const connFds = connections.map((c) => fdOf(c.socket)!);
    stateFd = writeStateMemfd(p.daemon.snapshot());
    const record = encodeHandover({
      writtenNs: monotonicNs(),
      legacy: { ok: p.legacy.ok, refused: p.legacy.refused, failed: p.legacy.failed },
      connections: connections.map((c, i) => ({ ino: fs.fstatSync(connFds[i]!, { bigint: true }).ino, kind: c.kind, pending: c.pending })),
    });
    const recordFd = writeSealedMemfd(HANDOVER_MEMFD_NAME, record);
    const memfds = [stateFd, recordFd];
    return {
      stateFd,
      recordFd,
      connections,
      connFds,
      undo: () => {
        for (const fd of memfds) closeFd(fd);
        abort();
      },
    };
  } catch (e) {
    if (stateFd >= 0) closeFd(stateFd);
    abort();
    throw e;
  }
}

/** Runs `--version` of the installed binary as the exec would run it: null when it works, else why not. */
function checkInstalledBinary(timeoutMs = RESTART_CHECK_TIMEOUT_MS): Promise<string | null> {
  const script = process.argv[1];
  if (script === undefined) return Promise.resolve('process.argv has no script');
  try {
    fs.accessSync(process.execPath, fs.constants.X_OK);
    fs.accessSync(script, fs.constants.R_OK);
  } catch (e) {
    return Promise.resolve((e as Error).message);
  }
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [...withDaemonNodeFlags(process.execArgv), script, '--version'], {
      stdio: ['ignore', 'ignore', 'pipe'],
      env: allowedEnvironment(process.env),
    });
    let err = '';
    child.stderr.on('data', (d: Buffer) => (err += d.toString()).length > 4096 && (err = err.slice(-4096)));
    const t = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('error', (e) => (clearTimeout(t), resolve(e.message)));
    child.on('exit', (code, sig) => {
      clearTimeout(t);
      resolve(
        code === 0
          ? null
          : `${script} --version ${sig ? `was killed (${sig})` : `exited ${code}`}${err.trim() ? `: ${err.trim().split('\n').pop()}` : ''}`,
      );
    });
  });
}

export class Restarter {
  private running = false;
  private readonly requests = new RestartRequests();
  /** Restarts in place so far, for logs. */
  count = 0;

  constructor(private readonly p: RestartParts) {}

  /**
   * The restart in place. Resolves only when it did not happen (the check or the exec failed, or one
   * runs already), with why; a restart that happens never returns (the process is the new image).
   */
  async inPlace(trigger: string): Promise<string> {
    const { log, notifier } = this.p;
    if (this.running) {
      this.requests.again();
      return 'a restart runs already';
    }
    this.running = true;
    this.requests.first();
    try {
      await this.requests.quiet();
      const t0 = process.hrtime.bigint();
      const signalAt = wallMs();
      log.info({ trigger }, 'restart in place: checking the installed binary');
      const bad = await checkInstalledBinary();
      if (bad !== null) {
        const why = cannot('restart', `the installed binary does not run: ${bad}`, 'fix the installation; this helper goes on serving');
        log.error({ trigger }, why);
        return why;
      }
      const meanwhile = await this.requests.quiet();
      if (meanwhile > 0) log.warn({ trigger, meanwhile }, 'restart asked again while one runs: one restart does for all, once they stop');
      notifier.notify(`RELOADING=1\nSTATUS=restarting in place\nMONOTONIC_USEC=${monotonicNs() / 1000n}`);
      let prepared: Prepared;
      const stoppedAt = wallMs();
      try {
        prepared = await prepare(this.p);
      } catch (e) {
        const why = cannot('restart', (e as Error).message, 'this helper goes on serving');
        log.error({ trigger }, why);
        notifier.ready('serving (the restart was called off)');
        return why;
      }
      const inherited: Inherited = {
        ...this.p.opened.handover('restart'),
        dropped: true,
        named: new Map([
          [HANDOVER_NAMES.state, [prepared.stateFd]],
          [HANDOVER_NAMES.record, [prepared.recordFd]],
          [HANDOVER_NAMES.connections, prepared.connFds],
        ]),
      };
      const keep = inheritedFds(inherited);
      const stoppedMs = Number(process.hrtime.bigint() - t0) / 1e6;
      log.info(
        { connections: prepared.connFds.length, preparedMs: Math.round(stoppedMs) },
        'restart in place: executing the installed binary',
      );
      try {
        const clock: RestartClock = { signalAt, stoppedAt, execAt: wallMs() };
        disarmLoopWatchdog();
        reexecInPlace(keep, { ...inheritEnv(inherited), [RESTART_CLOCK_ENV]: JSON.stringify(clock) }, daemonArgv());
      } catch (e) {
        for (const fd of keep) {
          try {
            closeOnExec(fd);
          } catch {
            /* closed meanwhile */
          }
        }
        prepared.undo();
        startLoopWatchdog();
        const why = cannot('restart', `exec failed: ${(e as Error).message}`, 'this helper goes on serving');
        log.error({ trigger }, why);
        notifier.ready('serving (the restart was called off)');
        return why;
      }
    } finally {
      this.running = false;
    }
  }

  /**
   * The stop of a systemd service: the parts are stored in systemd's fd store for the next start
   * (they are dropped by systemd when it does not restart the service, or keeps no fds). Returns
   * false when nothing was stored (no NOTIFY_SOCKET, FDSTORE=0, or the state could not be taken).
   */
  async toFdStore(): Promise<boolean> {
    const { log, notifier } = this.p;
    const max = process.env.FDSTORE;
    if (notifier.socket === undefined || max === '0') return false;
    let prepared: Prepared;
    try {
      prepared = await prepare(this.p);
    } catch (e) {
      log.error({ err: (e as Error).message }, 'cannot hand over to the fd store: the next start begins fresh');
      return false;
    }
    for (const name of Object.values(HANDOVER_NAMES)) notifier.removeStoredFds(name);
    let stored = notifier.storeFds(HANDOVER_NAMES.state, [prepared.stateFd], { poll: false });
    stored = notifier.storeFds(HANDOVER_NAMES.record, [prepared.recordFd], { poll: false }) && stored;
    for (let i = 0; i < prepared.connFds.length; i += MAX_FDS_PER_MESSAGE) {
      stored = notifier.storeFds(HANDOVER_NAMES.connections, prepared.connFds.slice(i, i + MAX_FDS_PER_MESSAGE)) && stored;
    }
    closeFd(prepared.stateFd);
    closeFd(prepared.recordFd);
    log.info({ connections: prepared.connFds.length, stored }, 'handed over to the fd store (FDSTORE=1) for the next start');
    return stored;
  }
}
