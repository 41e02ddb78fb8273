/**
 * The schedstat thread gate, for every reader of thread stat lines (os/proc-tasks.ts each interval,
 * helper/guest/thread-reads.ts at a window's edges): a thread's line is served again, without a stat
 * read, when its run time (schedstat field 1, ns) equals the run time read just BEFORE that line was:
 * the line was printed at a run time at least that large, and the run time has not moved since, so
 * the thread has not run since the line was printed. Why that keeps the fields read from it
 * (kernel/sched/cputime.c): utime and stime are cputime_adjust() of the same sum_exec_runtime
 * schedstat prints, and it returns the previous split unchanged while that sum has not grown;
 * starttime is the task's, and an fd is bound to its task (a reused tid is another task, on which it
 * fails); processor only changes when the thread is moved, and a thread that did not run has
 * dticks = 0 whatever its package. A line that said R (running) is read again whatever its run time
 * says: the run time may lag (nohz_full).
 */
import { pread } from './libc/fds.js';

/** A schedstat line: three u64 in decimal. */
export const SCHEDSTAT_BYTES = 128;
/** Digits of a u64: a longer first schedstat field is not a run time. */
const RUNTIME_DIGITS = 20;
const SPACE = 0x20;

/**
 * pread of the schedstat open as `fd` into `buf` (SCHEDSTAT_BYTES at least): the length of its run
 * time's digits at buf[0], 0 when the field cannot serve as a gate (not digits, longer than a u64,
 * or "0": a kernel with sched_info off prints "0 0 0" for every thread), or -errno.
 */
export function readRunTime(fd: number, buf: Buffer): number {
  const n = pread(fd, buf, SCHEDSTAT_BYTES, 0);
  if (n < 0) return n;
  let i = 0;
  while (i < n && buf[i] !== SPACE) {
    const c = buf[i]!;
    if (c < 0x30 || c > 0x39) return 0;
    i++;
  }
  if (i === 0 || i > RUNTIME_DIGITS || i === n || (i === 1 && buf[0] === 0x30)) return 0;
  return i;
}

/** The decimal digits b[from, to) (at most 15 are exact in a double). */
export function digits(b: Buffer, from: number, to: number): number {
  let v = 0;
  for (let i = from; i < to; i++) v = v * 10 + (b[i]! - 0x30);
  return v;
}
