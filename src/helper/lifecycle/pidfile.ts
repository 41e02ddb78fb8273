/** The pidfile: created exclusively; a stale one (not a running vmsr-helper's) replaced, anything not one pid refused; released if ours. */
import fs from 'node:fs';
import path from 'node:path';
import { MAX_TID } from '../../model/vcpus.js';
import { cannotError } from '../../common/errors.js';

export interface Pidfile {
  readonly path: string;
  release(): void;
}

function parsePidfile(text: string): number | null {
  const t = text.trim();
  if (!/^\d{1,10}$/.test(t)) return null;
  const n = Number(t);
  return n > 0 && n <= MAX_TID ? n : null;
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** Whether `pid` runs vmsr-helper: its program or its script (the first non-option argument) is named so. */
export function isHelperProcess(pid: number, procRoot = '/proc'): boolean {
  let argv: string[];
  try {
    argv = fs.readFileSync(path.join(procRoot, String(pid), 'cmdline'), 'latin1').split('\0');
  } catch {
    return false;
  }
  const script = argv.slice(1).find((a) => !a.startsWith('-'));
  return [argv[0], script].some((a) => a !== undefined && /^(qemu-)?vmsr-helper(\.js)?$/.test(path.basename(a)));
}

function refuse(file: string, why: string, fix = 'remove it or choose another path with -f'): never {
  throw cannotError(`use pidfile ${file}`, why, fix);
}

export function acquirePidfile(file: string): Pidfile {
  for (let attempt = 0; attempt < 3; attempt++) {
    let fd: number;
    try {
      fd = fs.openSync(file, fs.constants.O_WRONLY | fs.constants.O_CREAT | fs.constants.O_EXCL | fs.constants.O_NOFOLLOW, 0o644);
    } catch (e) {
      const err = e as NodeJS.ErrnoException;
      if (err.code === 'EEXIST') {
        let text: string;
        try {
          const st = fs.lstatSync(file);
          if (st.isDirectory()) refuse(file, 'it is a directory', 'give a file path with -f');
          if (!st.isFile()) refuse(file, 'it exists and is not a regular file');
          // A pidfile is a few bytes; a large file is not ours to read, let alone delete.
          if (st.size > 64) refuse(file, `it exists and is not a pidfile (${st.size} bytes)`);
          text = fs.readFileSync(file, 'latin1');
        } catch (e) {
          if ((e as NodeJS.ErrnoException).code === 'ENOENT') continue; // vanished meanwhile: retry
          throw e;
        }
        const other = parsePidfile(text);
        if (other === null) refuse(file, 'it exists and does not hold a pid');
        if (other !== process.pid && isAlive(other) && isHelperProcess(other))
          throw cannotError(
            `create pidfile ${file}`,
            `another instance is running (pid ${other})`,
            'stop it or choose another pidfile with -f',
          );
        try {
          fs.unlinkSync(file); // stale: its process is gone, or the pid now belongs to another program
        } catch {
          /* someone else removed it: retry */
        }
        continue;
      }
      if (err.code === 'EISDIR') refuse(file, 'it is a directory', 'give a file path with -f');
      if (err.code === 'ELOOP') refuse(file, 'it is a symbolic link');
      if (err.code === 'ENOENT')
        throw cannotError(`create pidfile ${file}`, 'its directory does not exist', 'create it or choose another path with -f');
      if (err.code === 'EACCES')
        throw cannotError(`create pidfile ${file}`, 'permission denied', 'run as root or choose another path with -f');
      throw cannotError(`create pidfile ${file}`, err.message);
    }
    try {
      fs.writeSync(fd, `${process.pid}\n`);
    } finally {
      fs.closeSync(fd);
    }
    return pidfileOf(file);
  }
  throw cannotError(`create pidfile ${file}`, 'it keeps reappearing', 'check whether another instance is starting');
}

/** The pidfile `file` written for us (by acquirePidfile, possibly before an exec): release() removes it if still ours. */
export function pidfileOf(file: string, pid = process.pid): Pidfile {
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
