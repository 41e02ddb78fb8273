/**
 * The start-up steps that need root, done before the helper re-executes itself with dropped
 * privileges (privileges.ts, reexecDropped): the checks, the MSR devices (root-only files), the
 * listening socket (a root-owned directory, its mode and group) and the pidfile. Their fds cross the
 * exec; the new image finds them in INHERIT_ENV (takeInherited) and carries on from there.
 */
import fs from 'node:fs';
import net from 'node:net';
import { MsrDevice } from '../../msr/device.js';
import type { DaemonConfig } from '../daemon.js';
import { acquirePidfile, type Pidfile } from './pidfile.js';
import { LISTEN_BACKLOG, listenError, prepareSocketPath } from '../server/server.js';
import { listenWithMode } from '../server/socket-file.js';
import { checkPermission, checkTopology, checkVendor, openMsrDevices } from './startup-checks.js';
import { activationFd, takeActivation } from './systemd.js';
import { socketFd } from '../../os/peer.js';
import { cannot } from '../../common/errors.js';

export const INHERIT_ENV = 'VMSR_HELPER_INHERIT';

/** What the privileged steps opened, by fd number (fds survive exec). */
export interface Inherited {
  /** [cpu, fd] of each MSR device. */
  msr: [number, number][];
  /** The listening socket. */
  listen: number;
  /** The socket file bound for it (absent under socket activation). */
  socket?: { path: string; ino: number };
  /** The pidfile written (same pid after exec). */
  pidfile?: string;
  /** [path, fd] of files plug-ins write (--record), created as root. */
  files?: [string, number][];
}

const isFd = (v: unknown): v is number => Number.isInteger(v) && (v as number) >= 0 && (v as number) < 1 << 20;

/** The Inherited left by the image before the exec (removed from the environment), or null. */
export function takeInherited(env: NodeJS.ProcessEnv = process.env): Inherited | null {
  const text = env[INHERIT_ENV];
  if (text === undefined) return null;
  delete env[INHERIT_ENV];
  let v: Partial<Inherited>;
  try {
    v = JSON.parse(text) as Partial<Inherited>;
  } catch {
    throw new Error(`${INHERIT_ENV} is not valid JSON; it is set by the helper for itself, do not set it`);
  }
  const ok =
    Array.isArray(v.msr) &&
    v.msr.every((e) => Array.isArray(e) && e.length === 2 && Number.isInteger(e[0]) && e[0] >= 0 && e[0] < 1 << 16 && isFd(e[1])) &&
    isFd(v.listen) &&
    (v.socket === undefined || (typeof v.socket.path === 'string' && Number.isInteger(v.socket.ino))) &&
    (v.pidfile === undefined || typeof v.pidfile === 'string') &&
    (v.files === undefined || (Array.isArray(v.files) && v.files.every((e) => Array.isArray(e) && e.length === 2 && typeof e[0] === 'string' && isFd(e[1]))));
  if (!ok) throw new Error(`${INHERIT_ENV} is malformed; it is set by the helper for itself, do not set it`);
  return v as Inherited;
}

/** Every fd in an Inherited (to keep across exec). */
export function inheritedFds(i: Inherited): number[] {
  return [...i.msr.map(([, fd]) => fd), i.listen, ...(i.files ?? []).map(([, fd]) => fd)];
}

/**
 * Runs the privileged steps; on failure undoes what was done (the socket file, the pidfile) and
 * throws the step's error. `undo` is for a failure after this returns (the exec itself).
 */
export async function openPrivileged(config: DaemonConfig, writeFiles: readonly string[] = []): Promise<{ inherited: Inherited; undo(): void }> {
  const activation = takeActivation();
  const listenFd = activation ? activationFd(activation, config.socketPathGiven) : undefined;
  const device = new MsrDevice(config.hostPaths.msrPathTemplate);
  let server: net.Server | undefined;
  let pidfile: Pidfile | undefined;
  let socket: { path: string; ino: number } | undefined;
  const files: [string, number][] = [];
  const undo = () => {
    for (const [, fd] of files) fs.closeSync(fd);
    pidfile?.release();
    server?.close(); // libuv unlinks the path it bound
    device.close();
  };
  try {
    const cpus = checkTopology(config.hostPaths.sysRoot);
    checkVendor(config.vendor, config.hostPaths.procRoot);
    checkPermission(config.hostPaths.msrPathTemplate);
    openMsrDevices(device, cpus);
    let listen = listenFd;
    if (listen === undefined) {
      const p = config.socketPath;
      await prepareSocketPath(p);
      const srv = net.createServer();
      server = srv;
      await listenWithMode(p, { mode: config.socketMode, ...(config.socketGid !== undefined ? { gid: config.socketGid } : {}) }, () =>
        new Promise<void>((resolve, reject) => {
          srv.once('error', (e) => reject(listenError({ path: p }, e)));
          srv.listen({ path: p, backlog: LISTEN_BACKLOG }, () => resolve());
        }),
      );
      listen = serverFd(srv);
      socket = { path: p, ino: fs.statSync(p).ino };
    }
    if (config.daemonize || config.pidfileGiven) pidfile = acquirePidfile(config.pidfile);
    for (const f of writeFiles) {
      try {
        files.push([f, fs.openSync(f, 'w', 0o644)]);
      } catch (e) {
        throw new Error(cannot(`create ${f}`, (e as NodeJS.ErrnoException).code ?? (e as Error).message, `check the path`));
      }
    }
    const inherited: Inherited = { msr: device.openFds(), listen };
    if (files.length) inherited.files = files;
    if (socket) inherited.socket = socket;
    if (pidfile) inherited.pidfile = pidfile.path;
    return { inherited, undo };
  } catch (e) {
    undo();
    throw e;
  }
}

function serverFd(srv: net.Server): number {
  const fd = socketFd(srv as unknown as net.Socket);
  if (fd === undefined) throw new Error(cannot('keep the listening socket across exec', 'its fd is not known (an internal error)', 'report it'));
  return fd;
}
