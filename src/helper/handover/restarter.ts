/** Restarts QEMU does not see (docs/daemon.md "Restarts"): in place (SIGHUP, `vmsr-helper reload`) by exec, or into the fd store at a stop. */
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import type { Logger } from '../../logging/logger.js';
import type { Restartable } from './frozen.js';
import { socketFd } from '../../os/libc/sockets.js';
import { inheritEnv, inheritedFds, type Inherited } from './inherited.js';
import { allowedEnvironment, reexecInPlace, withDaemonNodeFlags } from '../../os/privileges/reexec.js';
import { closeFd } from '../../os/libc/fds.js';
import { writeStateMemfd } from '../../state/memfd.js';
import type { Handover } from '../../state/snapshot.js';
import { KEPT_NAMES } from '../../keeper/keeper-messages.js';
import type { OutsideKeep } from './outside-keep.js';
import { monotonicNs } from '../../sampling/tick-loop.js';
import { cannot } from '../../common/errors.js';
import { takeEnvJson } from '../../common/env-json.js';

/** Longest wait for queued replies and v2 clients' last frames: a legacy connection with replies still queued is closed (what was sent is unknown). */
const RESTART_DRAIN_MS = 200;
/** The old image's times (wall-clock ms) across the exec, for the new image's `restart phases` log line. */
export const RESTART_CLOCK_ENV = 'VMSR_HELPER_RESTART_CLOCK';
export type RestartClock = Record<'signalAt' | 'stoppedAt' | 'execAt', number>;
export const wallMs = (): number => performance.timeOrigin + performance.now();

/** The old image's times the exec carried (removed from the environment), or null. */
export function takeRestartClock(env: NodeJS.ProcessEnv = process.env): RestartClock | null {
  const valid = (v: Partial<RestartClock>) => [v.signalAt, v.stoppedAt, v.execAt].every((x) => typeof x === 'number' && Number.isFinite(x));
  return takeEnvJson(RESTART_CLOCK_ENV, valid, env) ?? null;
}

interface RestartParts {
  daemon: Restartable;
  /** What the start opened, as the exec hands it on. */
  opened: { handover(how: 'restart'): Inherited };
  legacy: Readonly<Handover['legacy']>;
  notifier: { notify(state: string): void; ready(status: string): void };
  /** An alarm survives the exec. */
  watchdog: { disarm(): void; start(): void };
  keep?: OutsideKeep;
  log: Logger;
}

/** How long no restart may have been asked before the exec. */
export const RESTART_QUIET_MS = 1000;
/** Longest the installed binary's `--version` may take: far above its second or two, as a busy host took over 10 s. */
export const RESTART_CHECK_TIMEOUT_MS = 30_000;

/** When a restart in place may exec: a SIGHUP while one runs pushes it back, so none reaches the new image before it holds SIGHUP (docs/security.md). */
export class RestartRequests {
  private lastAt = -Infinity;
  private meanwhile = 0;
  private running = false;

  /** A restart is asked: true when it is the first (done() ends it), false when it is the running one, later. */
  ask(): boolean {
    this.lastAt = performance.now();
    this.meanwhile = this.running ? this.meanwhile + 1 : 0;
    const first = !this.running;
    this.running = true;
    return first;
  }

  done(): void {
    this.running = false;
  }

  /** Resolves once no restart was asked for `quietMs`, with how many were asked after the first. */
  async quiet(quietMs = RESTART_QUIET_MS): Promise<number> {
    for (let left = quietMs; left > 0; left = this.lastAt + quietMs - performance.now()) await new Promise((r) => setTimeout(r, left));
    return this.meanwhile;
  }
}

/** Stops reading, waits for queued replies, writes the record; no turn of the event loop until it is handed on (`undo` or a throw: read again). */
async function prepare(p: RestartParts) {
  const frozen = p.daemon.freeze();
  const legacyQueued = () => frozen.connections().some((c) => c.kind === 'legacy' && c.socket.writableLength > 0);
  const end = Date.now() + RESTART_DRAIN_MS;
  while ((!frozen.drained || legacyQueued()) && Date.now() < end) await new Promise((r) => setTimeout(r, 2));
  try {
    const connections = frozen.connections().filter((c) => {
      if (c.kind !== 'legacy' || c.socket.writableLength === 0) return socketFd(c.socket) !== undefined;
      p.log.warn(
        { queuedBytes: c.socket.writableLength },
        'a legacy client reads none of its replies: its connection is closed, not handed over',
      );
      c.socket.destroy();
      return false;
    });
    const connFds = connections.map((c) => socketFd(c.socket)!);
    const handover: Handover = {
      writtenNs: monotonicNs(),
      legacy: { ...p.legacy },
      connections: connections.map((c, i) => ({ ino: fs.fstatSync(connFds[i]!, { bigint: true }).ino, kind: c.kind, pending: c.pending })),
    };
    return { record: writeStateMemfd(p.daemon.snapshot(), handover), writtenNs: handover.writtenNs, connFds, undo: () => frozen.thaw() };
  } catch (e) {
    frozen.thaw();
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
  const args = [...withDaemonNodeFlags(process.execArgv), script, '--version'];
  const opts = { env: allowedEnvironment(process.env), timeout: timeoutMs, killSignal: 'SIGKILL' as const };
  return new Promise((resolve) =>
    execFile(process.execPath, args, opts, (e, _out, err) => {
      if (e === null || typeof e.code === 'string') return resolve(e?.message ?? null); // a string code: it did not start
      const how = e.killed
        ? `did not finish within ${timeoutMs / 1000} s (a hung binary, or a host too busy)`
        : e.signal
          ? `was killed (${e.signal})`
          : `exited ${e.code}`;
      resolve(`${script} --version ${how}${err.trim() ? `: ${err.trim().split('\n').pop()}` : ''}`);
    }),
  );
}

export class Restarter {
  private readonly requests = new RestartRequests();

  constructor(private readonly p: RestartParts) {}

  /** The restart in place; resolves, with why, only when it did not happen. */
  async inPlace(trigger: string): Promise<string> {
    const { log, notifier } = this.p;
    /** `told`: systemd heard RELOADING=1 and hears it serves again. */
    const calledOff = (why: string, fix: string, told: boolean) => {
      const text = cannot('restart', why, fix);
      log.error({ trigger }, text);
      if (told) notifier.ready('serving (the restart was called off)');
      return text;
    };
    if (!this.requests.ask()) return 'a restart runs already';
    try {
      await this.requests.quiet();
      const signalAt = wallMs();
      log.info({ trigger }, 'restart in place: checking the installed binary');
      const bad = await checkInstalledBinary();
      if (bad !== null)
        return calledOff(`the installed binary does not run: ${bad}`, 'fix the installation; this helper goes on serving', false);
      const meanwhile = await this.requests.quiet();
      if (meanwhile > 0) log.warn({ trigger, meanwhile }, 'restart asked again while one runs: one restart does for all, once they stop');
      notifier.notify(`RELOADING=1\nSTATUS=restarting in place\nMONOTONIC_USEC=${monotonicNs() / 1000n}`);
      const stoppedAt = wallMs();
      const prepared = await prepare(this.p).catch((e: Error) => e);
      if (prepared instanceof Error) return calledOff(prepared.message, 'this helper goes on serving', true);
      const inherited: Inherited = {
        ...this.p.opened.handover('restart'),
        dropped: true,
        named: new Map([
          [`${KEPT_NAMES.checkpointPrefix}${prepared.writtenNs}`, [prepared.record]],
          [KEPT_NAMES.connectionPrefix, prepared.connFds],
        ]),
      };
      log.info(
        { connections: prepared.connFds.length, preparedMs: Math.round(wallMs() - signalAt) },
        'restart in place: executing the installed binary',
      );
      try {
        const clock: RestartClock = { signalAt, stoppedAt, execAt: wallMs() };
        this.p.watchdog.disarm();
        reexecInPlace(inheritedFds(inherited), { ...inheritEnv(inherited), [RESTART_CLOCK_ENV]: JSON.stringify(clock) });
      } catch (e) {
        closeFd(prepared.record);
        prepared.undo();
        this.p.watchdog.start();
        return calledOff(`exec failed: ${(e as Error).message}`, 'this helper goes on serving', true);
      }
    } finally {
      this.requests.done();
    }
  }

  /** The stop of a systemd service: the record, with its hand-over, as the fd store's latest checkpoint; false when nothing was stored. */
  async toFdStore(): Promise<boolean> {
    const { log, keep } = this.p;
    if (keep?.holder !== 'fd store') return false;
    try {
      const prepared = await prepare(this.p);
      const stored = keep.store(prepared.record);
      closeFd(prepared.record);
      log.info({ connections: prepared.connFds.length, stored }, 'handed over to the fd store (FDSTORE=1) for the next start');
      return stored;
    } catch (e) {
      log.error({ err: (e as Error).message }, 'cannot hand over to the fd store: the next start begins fresh');
      return false;
    }
  }
}
