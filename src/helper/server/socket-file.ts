/** The listening socket's file: its path checked before anything is created (its mode and group: listener.ts), removed if ours. */
import fs from 'node:fs';
import path from 'node:path';
import type { Logger } from 'pino';
import { MAX_UNIX_PATH_BYTES } from '../../os/libc/sockets.js';
import { cannotError } from '../../common/errors.js';

export const DEFAULT_SOCKET_MODE = 0o600;

/** The socket path's length: a Unix socket address holds at most 107 bytes plus its NUL. */
export function checkSocketPathLength(socketPath: string): void {
  const n = Buffer.byteLength(socketPath);
  if (n > MAX_UNIX_PATH_BYTES) {
    throw new Error(
      `-k/--socket: socket path is ${n} bytes, a Unix socket path holds at most ${MAX_UNIX_PATH_BYTES} (sun_path is 108 bytes with its NUL); choose a shorter path`,
    );
  }
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

/** Removes the socket file we bound, only if it is still that inode (never someone else's file); a failure is logged to `log`, if given. */
export function removeOwnSocketFile(bound: { path: string; ino: number }, log?: Pick<Logger, 'warn'>): void {
  try {
    if (fs.statSync(bound.path).ino === bound.ino) fs.unlinkSync(bound.path);
  } catch (e) {
    const err = e as NodeJS.ErrnoException;
    // libuv may have unlinked it; EACCES (-u in a root-owned directory) is harmless: the next start replaces a dead socket.
    if (err.code !== 'ENOENT') log?.warn({ path: bound.path, err: err.code }, 'could not remove socket file');
  }
}
