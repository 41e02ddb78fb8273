/**
 * The keeper (docs/daemon.md "Crashes"): starts the serving process, holds what must outlive it (the start's fds, each QEMU
 * connection, the latest checkpoint: each fd checked) and starts it again with them. Real and saved uid 0 with no capability, so
 * -u's user cannot signal it (kill(2)); it never opens, unlinks or executes a path a serving process names.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import type { LogSink } from '../logging/logger.js';
import { closeFd, setCloexec, watchReadable, type FdWatch } from '../os/libc/fds.js';
import { F_SEAL_GROW, F_SEAL_SHRINK, F_SEAL_WRITE, unsealedWhy } from '../os/libc/memfd-mmap.js';
import { recvWithFds, socketpair, MSG_DONTWAIT, SOCK_SEQPACKET } from '../os/libc/sockets.js';
import { connectionIno } from './link.js';
import {
  decodeKeeperMessage,
  KEEPER_CHANNEL_FD,
  KEEPER_ENV,
  KEEPER_MESSAGE,
  KEPT_NAMES,
  MAX_KEEPER_MESSAGE_BYTES,
  type KeeperImage,
  type KeeperNote,
} from './keeper-messages.js';
import { endedFromOutside, oomKills, STOPPED_CHECK_AFTER_MS, stoppedBySignal } from './deaths.js';

/** A checkpoint as outside-keep.ts writes it: a memfd sealed against writes, growth and shrinking. */
const SEALED = F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK;

export const KEEPER_LIMITS = {
  /** The keeper stops after this many crashes in a row (the last one is not restarted). */
  maxCrashesInARow: 5,
  /** A serving process heard from this long after it was ready ends the row. */
  stableMs: 10_000,
  /** Wait before restarting after the 1st, 2nd, ... crash (or end from outside) in a row; the last for any later one. */
  backoffMs: [0, 200, 1000, 3000] as readonly number[],
  /** Most connections held (--max-connections is at most this; more are closed). */
  maxConnections: 65_536,
};

const SIGNALS = ['SIGTERM', 'SIGINT', 'SIGHUP'] as const;

/** As KeeperImage (`fds` passed to every serving process from KEEPER_FIRST_FD on); `onReady`: once the first serving process is. */
interface KeeperOptions extends Pick<KeeperImage, 'command' | 'socketFile' | 'pidfile'>, Partial<Pick<KeeperImage, 'fds'>> {
  env: NodeJS.ProcessEnv;
  log: LogSink<'info' | 'warn' | 'error'>;
  limits?: Partial<typeof KEEPER_LIMITS>;
  onReady?: () => void;
}

/** Runs the keeper until stopped (SIGTERM, SIGINT: passed on; the serving process's exit code), the first start fails (its exit code) or crashes come too often in a row (1). */
export function runKeeper(o: KeeperOptions): Promise<number> {
  const limits = { ...KEEPER_LIMITS, ...o.limits };
  // Placed by each spawn at KEEPER_FIRST_FD on: never also at their own numbers.
  for (const fd of o.fds ?? []) setCloexec(fd, true);
  return new Promise<number>((resolve) => new Keeper(o, limits, resolve));
}

class Keeper {
  private readonly conns = new Map<bigint, number>();
  private checkpoint: number | null = null;
  private checkpointGiven = false; // passed to the current serving process, which has not sent one of its own yet
  private child: ChildProcess | null = null;
  private channel: { fd: number; watch: FdWatch } | null = null;
  private everReady = false;
  private readyAt = 0;
  private lastHeard = 0; // its loop beats once a second
  private crashes = 0;
  private killed = 0; // ends from outside in a row: backed off, never a stop
  private oomAtSpawn = 0;
  private continuedAt = 0; // when last found stopped and continued
  private stopping = false;
  private hupWaiting = false; // a SIGHUP came while no serving process was ready: passed on once one is
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly o: KeeperOptions,
    private readonly limits: typeof KEEPER_LIMITS,
    private readonly done: (code: number) => void,
  ) {
    for (const sig of SIGNALS) process.on(sig, this.onSignal);
    this.spawn(null);
  }

  private readonly onSignal = (sig: NodeJS.Signals): void => {
    const running = this.child !== null && this.child.exitCode === null && this.child.signalCode === null;
    if (sig === 'SIGHUP') {
      // Only once ready: before, Node's start has SIGHUP at its default (it would end it). Restarts coalesce.
      if (running && this.readyAt > 0) this.child!.kill(sig);
      else this.hupWaiting = true;
      return;
    }
    this.stopping = true;
    if (running) this.child!.kill(sig);
    else this.finish(0);
  };

  private spawn(note: KeeperNote | null): void {
    const [mine, theirs] = socketpair(SOCK_SEQPACKET);
    const passed = (this.o.fds ?? []).map((fd): [string, number] => [KEPT_NAMES.start, fd]);
    if (this.checkpoint !== null) passed.push([`${KEPT_NAMES.checkpointPrefix}0`, this.checkpoint]);
    this.checkpointGiven = this.checkpoint !== null;
    for (const [ino, fd] of this.conns) passed.push([`${KEPT_NAMES.connectionPrefix}${ino}`, fd]);
    const env: NodeJS.ProcessEnv = { ...this.o.env, [KEEPER_ENV.channel]: String(KEEPER_CHANNEL_FD) };
    if (passed.length > 0) env[KEEPER_ENV.fdNames] = passed.map(([name]) => name).join(':');
    if (note !== null) env[KEEPER_ENV.note] = JSON.stringify(note);
    const [cmd, ...args] = this.o.command;
    const child = spawn(cmd!, args, { stdio: ['inherit', 'inherit', 'inherit', theirs, ...passed.map(([, fd]) => fd)], env });
    closeFd(theirs);
    this.child = child;
    this.oomAtSpawn = oomKills();
    this.lastHeard = Date.now();
    this.channel = { fd: mine, watch: watchReadable(mine, () => this.drain()) };
    child.once('error', (e) => this.o.log.error({ err: e.message }, 'keeper: cannot start the serving process'));
    const stops = setInterval(() => this.continueIfStopped(child), 1000);
    child.once('exit', (code, sig) => {
      clearInterval(stops);
      this.onExit(child, code, sig);
    });
  }

  /** Continues a silent serving process stopped by a signal: its watchdog would count it a hang (docs/security.md "The -u user ending the service"). */
  private continueIfStopped(child: ChildProcess): void {
    if (child.pid === undefined || Date.now() - this.lastHeard < STOPPED_CHECK_AFTER_MS || !stoppedBySignal(child.pid)) return;
    child.kill('SIGCONT');
    this.continuedAt = Date.now();
    this.o.log.warn(
      { servingPid: child.pid, silentMs: Date.now() - this.lastHeard },
      'keeper: the serving process was stopped by a signal from another process (SIGSTOP): continued',
    );
  }

  /** Reads every message waiting on the channel; the fd of one it does not use is closed. */
  private drain(): void {
    const ch = this.channel;
    if (ch === null) return;
    for (;;) {
      let r;
      try {
        r = recvWithFds(ch.fd, MAX_KEEPER_MESSAGE_BYTES + 1, 1, MSG_DONTWAIT);
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== 'EAGAIN') this.closeChannel();
        return;
      }
      if (r.data.length === 0 && r.fds.length === 0) return this.closeChannel();
      this.lastHeard = Date.now();
      const fd = r.fds[0];
      if (!this.take(r.data, fd) && fd !== undefined) closeFd(fd);
    }
  }

  /** Acts on one message; true when it kept `fd` (a connected stream socket, a sealed memfd). */
  private take(bytes: Buffer, fd: number | undefined): boolean {
    const m = decodeKeeperMessage(bytes);
    if (m === null) return false;
    switch (m.type) {
      case KEEPER_MESSAGE.hold: {
        const c = fd === undefined ? { why: '' } : connectionIno(fd);
        if (!('ino' in c) || this.conns.has(c.ino) || this.conns.size >= this.limits.maxConnections) return false;
        this.conns.set(c.ino, fd!);
        return true;
      }
      case KEEPER_MESSAGE.drop: {
        const ino = /^\d{1,20}$/.test(m.text) ? BigInt(m.text) : -1n;
        const held = this.conns.get(ino);
        if (held !== undefined) closeFd(held);
        this.conns.delete(ino);
        return false;
      }
      case KEEPER_MESSAGE.checkpoint:
        if (fd === undefined || unsealedWhy(fd, SEALED) !== null) return false;
        if (this.checkpoint !== null) closeFd(this.checkpoint);
        this.checkpoint = fd;
        this.checkpointGiven = false;
        return true;
      case KEEPER_MESSAGE.ready:
        this.readyAt = Date.now();
        if (!this.everReady) this.o.onReady?.();
        this.everReady = true;
        if (this.hupWaiting) this.child?.kill('SIGHUP');
        this.hupWaiting = false;
        return false;
      case KEEPER_MESSAGE.beat: // heard (drain): a SIGALRM now came from outside
        return false;
    }
  }

  private closeChannel(): void {
    if (this.channel === null) return;
    this.channel.watch.close();
    closeFd(this.channel.fd);
    this.channel = null;
  }

  private onExit(child: ChildProcess, code: number | null, sig: NodeJS.Signals | null): void {
    this.drain();
    this.closeChannel();
    this.child = null;
    const how = sig ?? `exit code ${code}`;
    if (this.stopping) return this.finish(code ?? 0);
    // Before the first ready too: -u's user may signal the re-executed start (docs/security.md "A second SIGHUP during a restart").
    if (sig === 'SIGHUP')
      return this.startAgain(
        { pid: child.pid ?? 0, how: 'SIGHUP', atMs: Date.now(), crashes: this.crashes },
        null,
        { checkpoint: this.checkpoint !== null },
        'was ended by a SIGHUP that came before it could take one (a restart asked for while Node started)',
        '; not counted as a crash',
      );
    if (!this.everReady) {
      this.o.log.error({ servingPid: child.pid, how }, 'keeper: the helper did not start; the keeper stops');
      return this.finish(code ?? 1);
    }
    // Served until last heard from: a loop its watchdog ended had stopped serving 10 s before.
    const stable = this.readyAt > 0 && this.lastHeard - this.readyAt >= this.limits.stableMs;
    // A clean stop (exit code 0) the keeper did not ask for: a SIGTERM or SIGINT from another process.
    const fromOutside = code === 0 && sig === null ? 'a SIGTERM or SIGINT' : sig;
    // Silent since it was found stopped and continued: its alarm fired while it was stopped, not a hang.
    const silentMs = this.continuedAt > this.lastHeard ? 0 : Date.now() - this.lastHeard;
    if (fromOutside !== null && (sig === null || endedFromOutside(sig, { oomBefore: this.oomAtSpawn, silentMs }))) {
      // Not a crash in the row that stops the keeper: the -u user, who may signal it, cannot end the service that way.
      this.killed = stable ? 1 : this.killed + 1;
      return this.startAgain(
        { ...this.noteOf(child, fromOutside), fromOutside: true },
        this.backoff(this.killed),
        { how: fromOutside, killedInARow: this.killed },
        `was ended by ${fromOutside} from another process (not a crash: not counted toward the ${this.limits.maxCrashesInARow} in a row that stop the keeper; to stop the helper, signal the keeper, pid ${process.pid})`,
      );
    }
    this.crashes = stable ? 1 : this.crashes + 1;
    const note = this.noteOf(child, how);
    const max = this.limits.maxCrashesInARow;
    if (this.crashes >= max) {
      this.o.log.error(
        { servingPid: note.pid, how, crashes: this.crashes },
        `keeper: the serving process died ${this.crashes} times in a row (the last: ${how}): the keeper stops and closes every connection; see the log above for why, fix it and start the helper again`,
      );
      return this.finish(1);
    }
    const delay = this.backoff(this.crashes);
    this.startAgain(note, delay, { how, crashes: this.crashes, max, checkpoint: this.checkpoint !== null }, `died (${how})`);
  }

  /** Logs why and starts a serving process again after `delay` ms (null: now). */
  private startAgain(note: KeeperNote, delay: number | null, fields: object, why: string, after = ''): void {
    this.readyAt = 0;
    const when = delay === null ? ' at once' : delay > 0 ? ` in ${delay} ms` : '';
    this.o.log.warn(
      { servingPid: note.pid, ...fields, ...(delay !== null ? { restartInMs: delay } : {}), connections: this.conns.size },
      `keeper: the serving process ${why}: starting it again${when} with its connections${after}`,
    );
    if (delay === null) this.spawn(note);
    else this.timer = setTimeout(() => this.spawn(note), delay);
  }

  private backoff(inARow: number): number {
    return this.limits.backoffMs[Math.min(inARow - 1, this.limits.backoffMs.length - 1)] ?? 0;
  }

  /** The note for the next serving process; a checkpoint the dead one had not replaced is dropped (it may be what killed it). */
  private noteOf(child: ChildProcess, how: string): KeeperNote {
    const note: KeeperNote = { pid: child.pid ?? 0, how, atMs: Date.now(), crashes: this.crashes };
    if (this.checkpointGiven && this.checkpoint !== null) {
      closeFd(this.checkpoint);
      this.checkpoint = null;
      note.checkpointDropped = `the serving process (pid ${note.pid}) it was passed to died (${how}) before it wrote one of its own: it may be what crashed it`;
    }
    return note;
  }

  /** Closes what it holds and ends with `code`; the socket file goes only after crashes (else the serving process removed it). */
  private finish(code: number): void {
    clearTimeout(this.timer);
    for (const sig of SIGNALS) process.off(sig, this.onSignal);
    for (const fd of this.conns.values()) closeFd(fd);
    this.conns.clear();
    if (this.checkpoint !== null) closeFd(this.checkpoint);
    for (const fd of this.o.fds ?? []) closeFd(fd);
    const { socketFile: file, pidfile } = this.o;
    if (code !== 0 && file !== undefined) removeIf(file.path, () => fs.lstatSync(file.path).ino === file.ino);
    if (pidfile !== undefined) removeIf(pidfile, () => fs.readFileSync(pidfile, 'utf8').trim() === String(process.pid));
    this.done(code);
  }
}

function removeIf(path: string, ours: () => boolean): void {
  try {
    if (ours()) fs.unlinkSync(path);
  } catch {
    /* gone already, or not ours to remove (-u's user in a root directory: the next start replaces it) */
  }
}
