/** The listening socket, opened in one place: a path bound here, or an fd bound before; connections wait, paused, until serve(). */
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import type { Logger } from '../../logging/logger.js';
import { acceptNow, MAX_UNIX_PATH_BYTES, socketFd } from '../../os/libc/sockets.js';
import { cannotError } from '../../common/errors.js';

// The server's defaults the CLI shows: here, in a module the root start loads anyway (docs/performance.md, "Start-up").
export const DEFAULT_SOCKET_MODE = 0o600;
/** Connections served at once by default (--max-connections); more are accepted and closed at once (server.ts). */
export const DEFAULT_MAX_CONNECTIONS = 4096;
/** incomplete-frames.ts's bounds (--frame-timeout sets deadlineMs). */
export const DEFAULT_INCOMPLETE_LIMITS = {
  /** Bytes held over all connections; a connection that would go past it is closed. */
  maxBytes: 16 * 1024 * 1024,
  /** How long one frame or request may stay incomplete, from its first byte. */
  deadlineMs: 10_000,
};
/** busy-poll.ts's window's maximum by default (µs, --busy-poll-max-us): QEMU's default poll-max-ns for its I/O threads, 32768 ns. */
export const DEFAULT_BUSY_POLL_MAX_US = 32;
/** The longest --busy-poll-max-us: a millisecond, past any round trip a poll could save. */
export const MAX_BUSY_POLL_US = 1000;

/** The socket path's length: a Unix socket address holds at most 107 bytes plus its NUL. */
export function checkSocketPathLength(socketPath: string): void {
  const n = Buffer.byteLength(socketPath);
  if (n > MAX_UNIX_PATH_BYTES)
    throw new Error(
      `-k/--socket: socket path is ${n} bytes, a Unix socket path holds at most ${MAX_UNIX_PATH_BYTES} (sun_path is 108 bytes with its NUL); choose a shorter path`,
    );
}

export function checkSocketDirectory(socketPath: string): void {
  const dir = path.dirname(socketPath);
  const what = `create socket ${socketPath}`;
  let st: fs.Stats;
  try {
    st = fs.statSync(dir);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') throw cannotError(what, `directory ${dir} does not exist`, 'create it or choose another path with -k');
    throw cannotError(what, `cannot reach directory ${dir} (${code})`, 'choose another path with -k');
  }
  if (!st.isDirectory()) throw cannotError(what, `${dir} is not a directory`, 'choose another path with -k');
}

/** A socket file we bound, by path and inode: removed only while it is still that inode (never someone else's file). */
interface SocketFile {
  path: string;
  ino: number;
}

export function removeOwnSocketFile(bound: SocketFile, log?: Pick<Logger, 'warn'>): void {
  try {
    if (fs.statSync(bound.path).ino === bound.ino) fs.unlinkSync(bound.path);
  } catch (e) {
    const err = e as NodeJS.ErrnoException;
    // libuv may have unlinked it; EACCES (-u in a root-owned directory) is harmless: the next start replaces a dead socket.
    if (err.code !== 'ENOENT') log?.warn({ path: bound.path, err: err.code }, 'could not remove socket file');
  }
}

type ListenTarget = { path: string } | { fd: number };

interface ListenOptions {
  mode?: number;
  /** The socket file's group (e.g. QEMU's), unchanged when undefined. */
  gid?: number;
  /** With an fd target: the socket file bound for it (before an exec), ours to remove at close. */
  file?: SocketFile;
}

/** listen() backlog: QEMU's connect() blocks while it is full. */
const LISTEN_BACKLOG = 4096;

/**
 * Connections accepted past the one libuv accepts per event-loop turn (since libuv 1.45), at most, each turn. Under load, one a
 * turn made the last of 256 new connections wait 0.5 to 1 s, a turn serving every connection already open; more than this would
 * make each turn of a connection flood longer for the connections being served (docs/daemon.md, "What other users cannot delay").
 */
export const EXTRA_ACCEPTS_PER_TURN = 31;

/** A connection's fd as a socket that reads nothing until served (the incomplete-frame budget starts it), as accepted ones are. */
export function pausedSocket(fd: number): net.Socket {
  return new net.Socket({ fd, readable: true, writable: true, pauseOnCreate: true } as net.SocketConstructorOpts);
}

export class Listener {
  private held: net.Socket[] = [];
  private heldErrors: Error[] = [];
  private onConnection: ((s: net.Socket) => void) | undefined;
  private onError: ((e: Error) => void) | undefined;
  private closing: Promise<void> | undefined;

  constructor(
    private readonly server: net.Server,
    /** The listening socket's fd (what crosses an exec). */
    readonly fd: number,
    /** The socket file we bound, or were handed with the fd; absent for systemd's socket. */
    readonly file: SocketFile | undefined,
  ) {
    server.on('connection', (s: net.Socket) => {
      this.deliver(s);
      this.acceptWaiting();
    });
    server.on('error', (e: Error) => (this.onError ? this.onError(e) : this.heldErrors.push(e)));
  }

  private deliver(s: net.Socket): void {
    if (this.onConnection) this.onConnection(s);
    else this.held.push(s);
  }

  /** Connections waiting in the backlog, up to EXTRA_ACCEPTS_PER_TURN; an error (EMFILE) is left to libuv's next accept, which reports it. */
  private acceptWaiting(): void {
    for (let i = 0; i < EXTRA_ACCEPTS_PER_TURN && !this.closing; i++) {
      const fd = acceptNow(this.fd);
      if (fd < 0) return;
      this.deliver(pausedSocket(fd));
    }
  }

  get where(): string {
    return this.file ? this.file.path : `systemd socket (fd ${this.fd})`;
  }

  /** Hands every connection (the held ones first) and every error (accept's EMFILE) to the server. */
  serve(onConnection: (s: net.Socket) => void, onError: (e: Error) => void): void {
    this.onConnection = onConnection;
    this.onError = onError;
    for (const e of this.heldErrors.splice(0)) onError(e);
    for (const s of this.held.splice(0)) onConnection(s);
  }

  /** Connections accepted from now on are held again until serve() (a restart hands them over unread). */
  hold(): void {
    this.onConnection = undefined;
    this.onError = undefined;
  }

  /** The connections held (accepted, never read): a restart hands them over; they stay held here. */
  get heldConnections(): readonly net.Socket[] {
    return this.held;
  }

  /** Stops accepting, closes held connections, removes the socket file if still ours (idempotent). */
  close(log?: Pick<Logger, 'warn'>): Promise<void> {
    this.closing ??= (async () => {
      const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
      for (const s of this.held.splice(0)) s.destroy();
      await closed;
      if (this.file) removeOwnSocketFile(this.file, log);
    })();
    return this.closing;
  }
}

/** THE bind: listens on the path (mode and group set with no moment looser than asked) or adopts the fd. */
export async function openListener(target: ListenTarget, o: ListenOptions = {}): Promise<Listener> {
  // Paused: a connection is read once the incomplete-frame budget has room (IncompleteFrames).
  const server = net.createServer({ pauseOnConnect: true });
  const listen = (opts: ListenTarget) =>
    new Promise<void>((resolve, reject) => {
      const failed = (e: Error) => reject(listenError(target, e));
      server.once('error', failed);
      server.listen({ ...opts, backlog: LISTEN_BACKLOG }, () => {
        server.off('error', failed);
        resolve();
      });
    });
  if ('fd' in target) {
    await listen({ fd: target.fd });
    return new Listener(server, serverFd(server), o.file);
  }
  const p = target.path;
  checkSocketPathLength(p);
  checkSocketDirectory(p);
  // A stale socket file (a crashed helper's) is removed; a live one is refused.
  await removeStaleSocket(p);
  let file: SocketFile | undefined;
  try {
    // Bound under umask 0177 (0600 at most), then given the asked mode and group: never looser than asked, whatever the umask.
    const umask = process.umask(0o177);
    try {
      await listen({ path: p });
    } finally {
      process.umask(umask);
    }
    // Ours to remove from now on, even if setting its mode fails.
    file = { path: p, ino: fs.statSync(p).ino };
    if (o.gid !== undefined) fs.chownSync(p, -1, o.gid);
    fs.chmodSync(p, o.mode ?? DEFAULT_SOCKET_MODE);
  } catch (e) {
    if (file) await new Listener(server, -1, file).close();
    throw e;
  }
  return new Listener(server, serverFd(server), file);
}

function serverFd(server: net.Server): number {
  const fd = socketFd(server as unknown as net.Socket);
  if (fd === undefined) throw cannotError('keep the listening socket', 'its fd is not known (an internal error)', 'report it');
  return fd;
}

function listenError(t: ListenTarget, e: Error): Error {
  const err = e as NodeJS.ErrnoException;
  if ('fd' in t) return cannotError(`listen on the socket passed by systemd (fd ${t.fd})`, err.message, 'check the .socket unit');
  if (err.code === 'EACCES')
    return cannotError(`create socket ${t.path}`, 'permission denied', 'run as root or choose another path with -k');
  if (err.code === 'ENOENT')
    return cannotError(`create socket ${t.path}`, 'its directory does not exist', 'create it or choose another path with -k');
  if (err.code === 'EADDRINUSE')
    return cannotError(`create socket ${t.path}`, 'address in use', 'another helper may be starting, or remove the file');
  return cannotError(`listen on ${t.path}`, err.message);
}

/** A socket file nobody listens on (a crashed helper's) is removed; a live one, or not a socket, is reported. */
async function removeStaleSocket(socketPath: string): Promise<void> {
  let st: fs.Stats;
  try {
    st = fs.lstatSync(socketPath);
  } catch {
    return;
  }
  if (!st.isSocket()) throw new Error(`${socketPath} exists and is not a socket; remove it or choose another path with -k`);
  const live = await new Promise<boolean>((resolve) => {
    const c = net.connect({ path: socketPath });
    c.once('connect', () => {
      c.destroy();
      resolve(true);
    });
    // EAGAIN: the backlog of a live listener is full (a busy helper), not a dead socket.
    c.once('error', (e: NodeJS.ErrnoException) => resolve(e.code === 'EAGAIN'));
  });
  if (live) throw new Error(`another process is already listening on ${socketPath}; stop it or choose another path with -k`);
  fs.unlinkSync(socketPath);
}
