/**
 * The pidfile: created exclusively, refusing a second live instance; a pidfile whose process is gone
 * (or that holds garbage) is stale and replaced. Released only if it still holds our pid.
 */
import fs from 'node:fs';
import { MAX_TID } from '../ratio/types.js';
import { cannotError } from '../ratio/errors.js';

export interface Pidfile {
  readonly path: string;
  release(): void;
}

/** The pid in a pidfile's text, or null when it is not one. */
export function parsePidfile(text: string): number | null {
  const t = text.trim();
  if (!/^\d{1,10}$/.test(t)) return null;
  const n = Number(t);
  return n > 0 && n <= MAX_TID ? n : null;
}

export function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}

export function acquirePidfile(file: string, pid = process.pid): Pidfile {
  for (let attempt = 0; attempt < 3; attempt++) {
    let fd: number;
    try {
      fd = fs.openSync(file, fs.constants.O_WRONLY | fs.constants.O_CREAT | fs.constants.O_EXCL | fs.constants.O_NOFOLLOW, 0o644);
    } catch (e) {
      const err = e as NodeJS.ErrnoException;
      if (err.code === 'EEXIST') {
        let text = '';
        try {
          text = fs.readFileSync(file, 'utf8');
        } catch {
          /* vanished meanwhile: retry */
        }
        const other = parsePidfile(text);
        if (other !== null && other !== pid && isAlive(other)) {
          throw cannotError(`create pidfile ${file}`, `another instance is running (pid ${other})`, 'stop it or choose another pidfile with -f');
        }
        try {
          fs.unlinkSync(file); // stale: its process is gone
        } catch {
          /* someone else removed it: retry */
        }
        continue;
      }
      if (err.code === 'ENOENT') throw cannotError(`create pidfile ${file}`, 'its directory does not exist', 'create it or choose another path with -f');
      if (err.code === 'EACCES') throw cannotError(`create pidfile ${file}`, 'permission denied', 'run as root or choose another path with -f');
      throw cannotError(`create pidfile ${file}`, err.message);
    }
    try {
      fs.writeSync(fd, `${pid}\n`);
    } finally {
      fs.closeSync(fd);
    }
    return {
      path: file,
      release() {
        try {
          if (parsePidfile(fs.readFileSync(file, 'utf8')) === pid) fs.unlinkSync(file);
        } catch {
          /* gone already, or no longer removable after dropping privileges */
        }
      },
    };
  }
  throw cannotError(`create pidfile ${file}`, 'it keeps reappearing', 'check whether another instance is starting');
}
