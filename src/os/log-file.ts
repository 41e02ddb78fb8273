/**
 * --log-file: the daemon's stderr becomes a file, so every log line (and anything Node itself
 * prints) goes there, in the JSON-lines format (src/logging/logger.ts picks it for a file). The file
 * is opened once, by the first image (as root, before the privilege drop), appended to and created
 * mode 0640; being fd 2 it crosses the start-up re-exec and a restart in place unchanged, and the
 * dropped daemon never needs to open it again. A symbolic link is refused (O_NOFOLLOW: a user who
 * may write the directory must not redirect root's appends to another file), and so is anything
 * but a regular file or a character device (/dev/null).
 */
import fs from 'node:fs';
import { cannotError } from '../common/errors.js';
import { dup2 } from './libc/fds.js';

export function redirectStderrToFile(path: string): void {
  let fd: number;
  try {
    fd = fs.openSync(path, fs.constants.O_WRONLY | fs.constants.O_APPEND | fs.constants.O_CREAT | fs.constants.O_NOFOLLOW, 0o640);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    const why = code === 'ELOOP' ? 'it is a symbolic link' : (e as Error).message;
    throw cannotError(`open the log file ${path}`, why, 'give --log-file a path in a directory you may write (e.g. /var/log/), not a link');
  }
  try {
    const st = fs.fstatSync(fd);
    if (!st.isFile() && !st.isCharacterDevice())
      throw cannotError(`log to ${path}`, 'it is not a regular file', 'give --log-file the path of a file');
    if (fd !== 2) dup2(fd, 2);
  } finally {
    if (fd !== 2) fs.closeSync(fd);
  }
}
