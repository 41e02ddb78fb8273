/**
 * systemd integration without libsystemd: socket activation (sd_listen_fds), sd_notify and the
 * watchdog, following the documented environment protocol (as QEMU's util/systemd.c does).
 */
import { sendUnixDatagram, MAX_FDS_PER_MESSAGE, socketType, SOCK_STREAM } from '../../os/libc/sockets.js';
import { cannot, cannotError } from '../../common/errors.js';
import type { Inherited } from '../handover/inherited.js';
import { KEPT_NAMES } from '../../keeper/keeper-messages.js';

const FIRST_SOCKET_ACTIVATION_FD = 3;
/**
 * Most fds accepted from LISTEN_FDS: systemd's own ceiling for a service's fd store
 * (FileDescriptorStoreMax=) is 4096, and sockets of a .socket unit come on top of it.
 */
const MAX_LISTEN_FDS = 8192;
/** Longest fd name (LISTEN_FDNAMES, FDNAME=): systemd's fdname_is_valid(). */
const MAX_FD_NAME_CHARS = 255;

/** An fd name as systemd accepts it (fdname_is_valid; not empty: this helper never uses one): null, else why not. */
export function fdNameProblem(name: string): string | null {
  if (name.length === 0) return 'it is empty';
  if (name.length > MAX_FD_NAME_CHARS) return `it is ${name.length} characters, at most ${MAX_FD_NAME_CHARS}`;
  if (!/^[\x20-\x39\x3b-\x7e]+$/.test(name)) return 'it has a character outside printable ASCII, or a colon';
  return null;
}

interface Activation {
  fds: number;
  names: string[];
}

/** Parses LISTEN_PID / LISTEN_FDS / LISTEN_FDNAMES: null when absent or not ours; throws when malformed. */
export function parseActivationEnv(env: NodeJS.ProcessEnv, pid: number): Activation | null {
  const listenPid = env.LISTEN_PID;
  const listenFds = env.LISTEN_FDS;
  if (listenPid === undefined || listenFds === undefined) return null;
  if (!/^\d+$/.test(listenPid) || Number(listenPid) !== pid) return null;
  if (!/^\d+$/.test(listenFds)) throw new Error(`socket activation: LISTEN_FDS is not a number: ${JSON.stringify(listenFds)}`);
  const fds = Number(listenFds);
  if (fds === 0) return null;
  const fix = "check the unit's FileDescriptorName= and what was stored with FDSTORE=1";
  if (fds > MAX_LISTEN_FDS) throw cannotError('take the fds systemd passed', `LISTEN_FDS is ${fds}, more than ${MAX_LISTEN_FDS}`, fix);
  if (env.LISTEN_FDNAMES === undefined) return { fds, names: [] };
  const names = env.LISTEN_FDNAMES.split(':');
  if (names.length !== fds) {
    throw cannotError('take the fds systemd passed', `LISTEN_FDNAMES has ${names.length} names for LISTEN_FDS=${fds}`, fix);
  }
  names.forEach((name, i) => {
    const problem = fdNameProblem(name);
    if (problem !== null)
      throw cannotError(
        'take the fds systemd passed',
        `the name of fd ${FIRST_SOCKET_ACTIVATION_FD + i} in LISTEN_FDNAMES ${problem}`,
        fix,
      );
  });
  return { fds, names };
}

/** The passed fds grouped by name, in fd order ("unknown" without LISTEN_FDNAMES, as sd_listen_fds_with_names(3)). */
export function activationFdsByName(act: Activation): Map<string, number[]> {
  const groups = new Map<string, number[]>();
  for (let i = 0; i < act.fds; i++) {
    const name = act.names[i] ?? 'unknown';
    const fds = groups.get(name) ?? [];
    fds.push(FIRST_SOCKET_ACTIVATION_FD + i);
    groups.set(name, fds);
  }
  return groups;
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

/** The passed fds the helper stored itself (FDSTORE=1, named with KEPT_NAMES.prefix), by name; any other is a listening socket. */
export function storedFds(act: Activation): Map<string, number[]> {
  return new Map([...activationFdsByName(act)].filter(([name]) => name.startsWith(KEPT_NAMES.prefix)));
}

/** The one listening socket among the passed fds (the others stored by the helper); no -k alongside (as qemu-vmsr-helper). */
export function activationFd(act: Activation, socketPathGiven: boolean): number {
  if (socketPathGiven)
    throw new Error('the socket path (-k) cannot be set when using socket activation; drop -k or start without systemd socket activation');
  const listening = [...activationFdsByName(act)].filter(([name]) => !name.startsWith(KEPT_NAMES.prefix)).flatMap(([, fds]) => fds);
  if (listening.length !== 1) {
    const got =
      listening.length === act.fds
        ? `got ${act.fds}`
        : `got ${listening.length} besides ${act.fds - listening.length} stored by the helper`;
    throw new Error(`socket activation with LISTEN_FDS > 1 is not supported (${got}); give the .socket unit a single ListenStream=`);
  }
  return listening[0]!;
}

/** WATCHDOG_USEC when it applies to us (WATCHDOG_PID absent or ours), in microseconds; else null. */
export function parseWatchdogEnv(env: NodeJS.ProcessEnv, pid: number): number | null {
  const usec = env.WATCHDOG_USEC;
  if (usec === undefined || !/^\d+$/.test(usec) || Number(usec) <= 0) return null;
  const wpid = env.WATCHDOG_PID;
  if (wpid !== undefined && (!/^\d+$/.test(wpid) || Number(wpid) !== pid)) return null;
  return Number(usec);
}

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

  /**
   * Hands `fds` to systemd's fd store under `name` (sd_notify(3)); `poll: false` adds FDPOLL=0 (kept
   * through POLLHUP/POLLERR). False when nothing was sent; a bad name or fd count throws (the caller's mistake).
   */
  storeFds(name: string, fds: readonly number[], opts: { poll?: boolean } = {}): boolean {
    const problem = fdNameProblem(name);
    if (problem !== null)
      throw cannotError(`store fds as '${name}'`, `the name ${problem}`, 'name them with 1..255 printable ASCII characters, no colon');
    if (fds.length === 0 || fds.length > MAX_FDS_PER_MESSAGE) {
      throw cannotError(`store fds as '${name}'`, `${fds.length} fds, one message carries 1..${MAX_FDS_PER_MESSAGE}`);
    }
    if (!this.socket) return false;
    const state = `FDSTORE=1\nFDNAME=${name}${opts.poll === false ? '\nFDPOLL=0' : ''}`;
    try {
      sendUnixDatagram(this.socket, Buffer.from(state, 'utf8'), fds);
      return true;
    } catch (e) {
      this.onError(new Error(cannot(`store fds as '${name}' with systemd`, (e as Error).message), { cause: e }));
      return false;
    }
  }

  removeStoredFds(name: string): void {
    const problem = fdNameProblem(name);
    if (problem !== null) throw cannotError(`remove the stored fds '${name}'`, `the name ${problem}`);
    this.notify(`FDSTOREREMOVE=1\nFDNAME=${name}`);
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

/** What this process inherits from systemd: its listening socket when socket-activated, and the fds the helper stored. */
export function inheritFromEnvironment(socketPathGiven: boolean, env: NodeJS.ProcessEnv = process.env): Inherited {
  const activation = takeActivation(env);
  if (activation === null) return { how: 'fresh' };
  const named = storedFds(activation);
  // Only fds the helper stored (a service without a .socket unit): it binds its socket itself.
  if ([...named.values()].flat().length === activation.fds) return { how: 'systemd', named };
  const fd = activationFd(activation, socketPathGiven);
  let type: number;
  try {
    type = socketType(fd);
  } catch (e) {
    throw new Error(cannot(`use the socket systemd passed as fd ${fd}`, (e as Error).message, 'check the .socket unit (ListenStream=)'));
  }
  if (type !== SOCK_STREAM)
    throw new Error(
      cannot(`use the socket systemd passed as fd ${fd}`, 'it is not a stream socket', 'use ListenStream= in the .socket unit'),
    );
  return { how: 'systemd', listener: { fd }, ...(named.size > 0 ? { named } : {}) };
}
