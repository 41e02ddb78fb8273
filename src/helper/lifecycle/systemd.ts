/**
 * systemd integration without libsystemd: socket activation (sd_listen_fds), sd_notify and the
 * watchdog, following the documented environment protocol (as QEMU's util/systemd.c does).
 */
import { sendUnixDatagram } from '../../os/libc.js';

export const FIRST_SOCKET_ACTIVATION_FD = 3;

export interface Activation {
  /** Number of fds passed, starting at fd 3. */
  fds: number;
  names: string[];
}

/**
 * Parses LISTEN_PID / LISTEN_FDS / LISTEN_FDNAMES. Null when the variables are absent or meant for
 * another process (LISTEN_PID is not ours); throws when they are ours but malformed.
 */
export function parseActivationEnv(env: NodeJS.ProcessEnv, pid: number): Activation | null {
  const listenPid = env.LISTEN_PID;
  const listenFds = env.LISTEN_FDS;
  if (listenPid === undefined || listenFds === undefined) return null;
  if (!/^\d+$/.test(listenPid) || Number(listenPid) !== pid) return null;
  if (!/^\d+$/.test(listenFds)) throw new Error(`socket activation: LISTEN_FDS is not a number: ${JSON.stringify(listenFds)}`);
  const fds = Number(listenFds);
  if (fds === 0) return null;
  const names = env.LISTEN_FDNAMES === undefined ? [] : env.LISTEN_FDNAMES.split(':');
  return { fds, names };
}

/** Reads and removes the activation variables, so children never see them (sd_listen_fds(1)). */
export function takeActivation(env: NodeJS.ProcessEnv = process.env, pid = process.pid): Activation | null {
  try {
    return parseActivationEnv(env, pid);
  } finally {
    delete env.LISTEN_PID;
    delete env.LISTEN_FDS;
    delete env.LISTEN_FDNAMES;
  }
}

/** Checks what the helper accepts: exactly one fd, and no -k alongside (as qemu-vmsr-helper). */
export function activationFd(act: Activation, socketPathGiven: boolean): number {
  if (socketPathGiven) throw new Error('the socket path (-k) cannot be set when using socket activation; drop -k or start without systemd socket activation');
  if (act.fds > 1) throw new Error(`socket activation with LISTEN_FDS > 1 is not supported (got ${act.fds}); give the .socket unit a single ListenStream=`);
  return FIRST_SOCKET_ACTIVATION_FD;
}

/** WATCHDOG_USEC when it applies to us (WATCHDOG_PID absent or ours), in microseconds; else null. */
export function parseWatchdogEnv(env: NodeJS.ProcessEnv, pid: number): number | null {
  const usec = env.WATCHDOG_USEC;
  if (usec === undefined || !/^\d+$/.test(usec) || Number(usec) <= 0) return null;
  const wpid = env.WATCHDOG_PID;
  if (wpid !== undefined && (!/^\d+$/.test(wpid) || Number(wpid) !== pid)) return null;
  return Number(usec);
}

export type NotifySink = (state: string) => void;

/** sd_notify: a no-op without NOTIFY_SOCKET; errors are reported, never thrown at the caller. */
export class Notifier {
  private timer: NodeJS.Timeout | undefined;
  readonly socket: string | undefined;

  constructor(
    env: NodeJS.ProcessEnv = process.env,
    private readonly onError: (e: Error) => void = () => {},
  ) {
    const s = env.NOTIFY_SOCKET;
    this.socket = s && (s.startsWith('/') || s.startsWith('@')) ? s : undefined;
  }

  notify(state: string): void {
    if (!this.socket) return;
    try {
      sendUnixDatagram(this.socket, Buffer.from(state, 'utf8'));
    } catch (e) {
      this.onError(e as Error);
    }
  }

  ready(status: string): void {
    this.notify(`READY=1\nSTATUS=${status}\nMAINPID=${process.pid}`);
  }

  stopping(): void {
    this.stopWatchdog();
    this.notify('STOPPING=1\nSTATUS=stopping');
  }

  /** WATCHDOG=1 every WATCHDOG_USEC/2, when systemd asked for it. Returns the interval in ms or null. */
  startWatchdog(env: NodeJS.ProcessEnv = process.env, pid = process.pid): number | null {
    const usec = parseWatchdogEnv(env, pid);
    if (usec === null || !this.socket) return null;
    const ms = Math.max(1, Math.floor(usec / 2000));
    this.stopWatchdog();
    this.notify('WATCHDOG=1');
    this.timer = setInterval(() => this.notify('WATCHDOG=1'), ms);
    this.timer.unref();
    return ms;
  }

  stopWatchdog(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
  }
}
