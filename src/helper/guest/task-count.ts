/**
 * How many threads a process has, from its task directory held open: its link count is 2 + its
 * threads, so one fstat (half a microsecond; a listing costs 8) tells whether the thread set may have changed.
 */
import fs from 'node:fs';
import { fstatRaw, STAT_SIZE } from '../../os/libc/fds.js';

/** Where st_nlink lies in x86_64's struct stat (after st_dev and st_ino). */
const NLINK_AT = 16;

export class TaskCount {
  private static readonly buf = Buffer.alloc(STAT_SIZE);

  first = -1;

  private constructor(private fd: number) {}

  /** The task directory of `pid` held open, with its count now; null when the process is gone. */
  static open(procRoot: string, pid: number): TaskCount | null {
    let fd: number;
    try {
      fd = fs.openSync(`${procRoot}/${pid}/task`, fs.constants.O_RDONLY | fs.constants.O_DIRECTORY);
    } catch {
      return null;
    }
    const t = new TaskCount(fd);
    t.first = t.now();
    if (t.first >= 0) return t;
    t.close();
    return null;
  }

  /** -1 when it cannot be read. */
  now(): number {
    if (this.fd < 0 || fstatRaw(this.fd, TaskCount.buf) < 0) return -1;
    return Number(TaskCount.buf.readBigUInt64LE(NLINK_AT)) - 2;
  }

  /** Blind to one thread gone and one new. */
  same(): boolean {
    return this.now() === this.first;
  }

  close(): void {
    if (this.fd < 0) return;
    fs.closeSync(this.fd);
    this.fd = -1;
  }
}
