/**
 * --log-file: stderr becomes a file the first image opens (as root), fd 2 across every exec. A symlink is refused (whoever
 * may write the directory must not redirect root's appends), and so is anything but a regular file or /dev/null.
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
