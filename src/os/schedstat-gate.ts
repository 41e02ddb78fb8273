/**
 * The schedstat thread gate: a thread's stat line is served again, unread, when its run time (schedstat field 1, ns) is
 * the one read just BEFORE that line was: it has not run since. The fields keep: utime and stime are cputime_adjust() of
 * the same sum_exec_runtime, which keeps the previous split while that sum has not grown (kernel/sched/cputime.c); an fd
 * is bound to its task; a thread that did not run has dticks = 0. A line that said R is read again (nohz_full lag).
 */
import { pread } from './libc/fds.js';

/** A schedstat line: three u64 in decimal. */
export const SCHEDSTAT_BYTES = 128;
/** Digits of a u64: a longer first schedstat field is not a run time. */
const RUNTIME_DIGITS = 20;
const SPACE = 0x20;

/** The length of the run time's digits at buf[0]; 0 when no gate (not a u64, or "0": sched_info off prints "0 0 0"); or -errno. */
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
