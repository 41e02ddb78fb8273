/**
 * The few /proc/<pid>/stat fields discovery needs: comm, flags (kernel threads), num_threads,
 * starttime, exit_signal (threads). Pure. Fields are counted after the LAST ')' since comm may hold ')' and spaces.
 */

export interface ProcessStat {
  comm: string;
  flags: number;
  numThreads: number;
  /** Field 22, clock ticks after boot. */
  starttime: number;
  /**
   * Field 38: -1 for a thread that is not its process's main thread (created with CLONE_THREAD).
   * /proc/<tid> of such a thread resolves though /proc does not list it: it is not a process.
   */
  exitSignal: number;
}

/** PF_KTHREAD: kernel threads are never VMs (and have no command line). */
export const PF_KTHREAD = 0x00200000;

const F_FLAGS = 9 - 3;
const F_NUM_THREADS = 20 - 3;
const F_STARTTIME = 22 - 3;
const F_EXIT_SIGNAL = 38 - 3;

export function parseProcessStat(line: string): ProcessStat | null {
  const open = line.indexOf(' (');
  const close = line.lastIndexOf(')');
  if (open <= 0 || close < open + 1 || line[close + 1] !== ' ') return null;
  const f = line.slice(close + 2).split(' ', F_EXIT_SIGNAL + 1);
  if (f.length <= F_EXIT_SIGNAL) return null;
  const num = (s: string | undefined) => (s !== undefined && /^\d{1,20}$/.test(s) ? Number(s) : NaN);
  const flags = num(f[F_FLAGS]);
  const numThreads = num(f[F_NUM_THREADS]);
  const starttime = num(f[F_STARTTIME]);
  const exitSignal = f[F_EXIT_SIGNAL] === '-1' ? -1 : num(f[F_EXIT_SIGNAL]);
  if (![flags, numThreads, starttime, exitSignal].every(Number.isSafeInteger)) return null;
  return { comm: line.slice(open + 2, close), flags, numThreads, starttime, exitSignal };
}

/** comm of a stat line, or null; cheap (no split), for lines read every interval. */
export function commOf(line: string): string | null {
  const open = line.indexOf(' (');
  const close = line.lastIndexOf(')');
  return open > 0 && close > open ? line.slice(open + 2, close) : null;
}
