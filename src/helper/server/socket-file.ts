/**
 * The listening socket's file: its path checked before anything is created, and its mode and group
 * set whatever the umask, with no moment where it exists with a looser mode than asked.
 */
import fs from 'node:fs';
import path from 'node:path';
import type { Logger } from 'pino';
import { MAX_UNIX_PATH_BYTES } from '../../os/libc/sockets.js';
import { cannot } from '../../common/errors.js';

export const DEFAULT_SOCKET_MODE = 0o600;

export interface SocketFileOptions {
  mode: number;
  /** Group of the socket file (e.g. the group QEMU runs as), unchanged when undefined. */
  gid?: number;
}

/** The socket path's length: a Unix socket address holds at most 107 bytes plus its NUL. */
export function checkSocketPathLength(socketPath: string): void {
  const n = Buffer.byteLength(socketPath);
  if (n > MAX_UNIX_PATH_BYTES) {
    throw new Error(
      `-k/--socket: socket path is ${n} bytes, a Unix socket path holds at most ${MAX_UNIX_PATH_BYTES} (sun_path is 108 bytes with its NUL); choose a shorter path`,
    );
  }
}

/** The directory must exist (and be one) before anything is created in it. */
export function checkSocketDirectory(socketPath: string): void {
  const dir = path.dirname(socketPath);
  let st: fs.Stats;
  try {
    st = fs.statSync(dir);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ENOENT')
      throw new Error(cannot(`create socket ${socketPath}`, `directory ${dir} does not exist`, `create it or choose another path with -k`));
    throw new Error(cannot(`create socket ${socketPath}`, `cannot reach directory ${dir} (${code})`, `choose another path with -k`));
  }
  if (!st.isDirectory()) throw new Error(cannot(`create socket ${socketPath}`, `${dir} is not a directory`, `choose another path with -k`));
}

/** Binds under umask 0177 (created 0600 at most), then sets the asked mode and group: never looser than asked. */
export async function listenWithMode(socketPath: string, o: SocketFileOptions, listen: () => Promise<void>): Promise<void> {
  const old = process.umask(0o177);
  try {
    await listen();
  } finally {
    process.umask(old);
  }
  if (o.gid !== undefined) fs.chownSync(socketPath, -1, o.gid);
  fs.chmodSync(socketPath, o.mode);
}

/** Removes the socket file we bound, only if it is still that inode (never someone else's file); a failure is logged to `log`, if given. */
export function removeOwnSocketFile(bound: { path: string; ino: number }, log?: Pick<Logger, 'warn'>): void {
  try {
    if (fs.statSync(bound.path).ino === bound.ino) fs.unlinkSync(bound.path);
  } catch (e) {
    const err = e as NodeJS.ErrnoException;
    // libuv may have unlinked it already; EACCES after dropping to -u in a root-owned directory
    // is harmless: the next start replaces a socket nobody listens on.
    if (err.code !== 'ENOENT') log?.warn({ path: bound.path, err: err.code }, 'could not remove socket file');
  }
}
