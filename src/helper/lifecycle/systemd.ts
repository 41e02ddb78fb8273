/** systemd without libsystemd: socket activation, sd_notify and the watchdog by their environment protocol (as QEMU's util/systemd.c). */
import { sendUnixDatagram, MAX_FDS_PER_MESSAGE, socketType, SOCK_STREAM } from '../../os/libc/sockets.js';
import { cannot, cannotError } from '../../common/errors.js';
import type { Inherited } from '../handover/inherited.js';
import { KEPT_NAMES } from '../../keeper/keeper-messages.js';

const FIRST_SOCKET_ACTIVATION_FD = 3;
/** Most fds taken from LISTEN_FDS: systemd's fd store holds at most 4096 (FileDescriptorStoreMax=), a .socket unit's come on top. */
const MAX_LISTEN_FDS = 8192;
/** Longest fd name (LISTEN_FDNAMES, FDNAME=): systemd's fdname_is_valid(). */
const MAX_FD_NAME_CHARS = 255;

/** An fd name as systemd accepts it (fdname_is_valid; not empty: this helper never uses one): null, else why not. */
function fdNameProblem(name: string): string | null {
  if (name.length === 0) return 'it is empty';
  if (name.length > MAX_FD_NAME_CHARS) return `it is ${name.length} characters, at most ${MAX_FD_NAME_CHARS}`;
  if (!/^[\x20-\x39\x3b-\x7e]+$/.test(name)) return 'it has a character outside printable ASCII, or a colon';
  return null;
}

interface Activation {
  fds: number;
  names: string[];
}

/** Takes LISTEN_PID / LISTEN_FDS / LISTEN_FDNAMES out of `env` (children never see them: sd_listen_fds(1)): null when absent or not ours. */
export function takeActivation(env: NodeJS.ProcessEnv, pid = process.pid): Activation | null {
  const { LISTEN_PID: listenPid, LISTEN_FDS: listenFds, LISTEN_FDNAMES: fdNames } = env;
  delete env.LISTEN_PID;
  delete env.LISTEN_FDS;
  delete env.LISTEN_FDNAMES;
  if (listenPid === undefined || listenFds === undefined) return null;
  if (!/^\d+$/.test(listenPid) || Number(listenPid) !== pid) return null;
  if (!/^\d+$/.test(listenFds)) throw new Error(`socket activation: LISTEN_FDS is not a number: ${JSON.stringify(listenFds)}`);
  const fds = Number(listenFds);
  if (fds === 0) return null;
  const [what, fix] = ['take the fds systemd passed', "check the unit's FileDescriptorName= and what was stored with FDSTORE=1"];
  if (fds > MAX_LISTEN_FDS) throw cannotError(what, `LISTEN_FDS is ${fds}, more than ${MAX_LISTEN_FDS}`, fix);
  if (fdNames === undefined) return { fds, names: [] };
  const names = fdNames.split(':');
  if (names.length !== fds) throw cannotError(what, `LISTEN_FDNAMES has ${names.length} names for LISTEN_FDS=${fds}`, fix);
  names.forEach((name, i) => {
    const problem = fdNameProblem(name);
    if (problem !== null) throw cannotError(what, `the name of fd ${FIRST_SOCKET_ACTIVATION_FD + i} in LISTEN_FDNAMES ${problem}`, fix);
  });
  return { fds, names };
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

  /** Hands `fds` to systemd's fd store as `name`; poll false: FDPOLL=0 (kept through POLLHUP/POLLERR). False: not sent; bad args throw. */
  storeFds(name: string, fds: readonly number[], opts: { poll?: boolean } = {}): boolean {
    const problem = fdNameProblem(name);
    if (problem !== null)
      throw cannotError(`store fds as '${name}'`, `the name ${problem}`, 'name them with 1..255 printable ASCII characters, no colon');
    if (fds.length === 0 || fds.length > MAX_FDS_PER_MESSAGE)
      throw cannotError(`store fds as '${name}'`, `${fds.length} fds, one message carries 1..${MAX_FDS_PER_MESSAGE}`);
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

  /** WATCHDOG=1 every WATCHDOG_USEC/2 when systemd asks for it (WATCHDOG_PID absent or ours); returns the interval in ms or null. */
  startWatchdog(env: NodeJS.ProcessEnv = process.env, pid = process.pid): number | null {
    const { WATCHDOG_USEC: usec, WATCHDOG_PID: wpid } = env;
    if (usec === undefined || !/^\d+$/.test(usec) || Number(usec) <= 0 || !this.socket) return null;
    if (wpid !== undefined && (!/^\d+$/.test(wpid) || Number(wpid) !== pid)) return null;
    const ms = Math.max(1, Math.floor(Number(usec) / 2000));
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

/** What this process inherits from systemd: the fds the helper stored (FDSTORE=1, named KEPT_NAMES.prefix...) by name, in fd order, and the one listening socket, no -k alongside (as qemu-vmsr-helper). */
export function inheritFromEnvironment(socketPathGiven: boolean, env: NodeJS.ProcessEnv = process.env): Inherited {
  const act = takeActivation(env);
  if (act === null) return { how: 'fresh' };
  const named = new Map<string, number[]>();
  const listening: number[] = [];
  for (let i = 0; i < act.fds; i++) {
    const name = act.names[i] ?? '';
    const fd = FIRST_SOCKET_ACTIVATION_FD + i;
    if (name.startsWith(KEPT_NAMES.prefix)) named.set(name, [...(named.get(name) ?? []), fd]);
    else listening.push(fd);
  }
  // Only fds the helper stored (a service without a .socket unit): it binds its socket itself.
  if (listening.length === 0) return { how: 'systemd', named };
  if (socketPathGiven)
    throw new Error('the socket path (-k) cannot be set when using socket activation; drop -k or start without systemd socket activation');
  if (listening.length > 1) {
    const got =
      listening.length === act.fds
        ? `got ${act.fds}`
        : `got ${listening.length} besides ${act.fds - listening.length} stored by the helper`;
    throw new Error(`socket activation with LISTEN_FDS > 1 is not supported (${got}); give the .socket unit a single ListenStream=`);
  }
  const fd = listening[0]!;
  let type: number;
  try {
    type = socketType(fd);
  } catch (e) {
    throw cannotError(`use the socket systemd passed as fd ${fd}`, (e as Error).message, 'check the .socket unit (ListenStream=)');
  }
  if (type !== SOCK_STREAM)
    throw cannotError(`use the socket systemd passed as fd ${fd}`, 'it is not a stream socket', 'use ListenStream= in the .socket unit');
  return { how: 'systemd', listener: { fd }, ...(named.size > 0 ? { named } : {}) };
}
