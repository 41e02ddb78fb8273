/** Polling until a condition holds, for tests that watch real processes and sockets. */
import type { ChildProcess } from 'node:child_process';
import fs from 'node:fs';

/** A child whose early exit ends the wait, with its log in the error. */
export interface WatchedChild {
  proc: ChildProcess;
  stderr(): string;
}

/**
 * Waits until `cond` holds (polling every 20 ms), or throws naming `what`, with the child's log. The
 * default deadline is far above what a start or a few samples take on an idle machine (under a
 * second): the suite runs beside other users' processes and busy loops.
 */
export async function waitFor(cond: () => boolean, what: string, child?: WatchedChild, ms = 30_000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (child && child.proc.exitCode !== null) throw new Error(`${what}: helper exited ${child.proc.exitCode}\n${child.stderr()}`);
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}\n${child?.stderr() ?? ''}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/**
 * Polls an async check (an HTTP scrape, a Prometheus query) every 200 ms until it returns a value,
 * or throws naming `what`, with `log()` (the logs of the processes involved).
 */
export async function pollFor<T>(check: () => Promise<T | undefined>, what: string, log: () => string, ms = 30_000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await check();
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}\n${log()}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/**
 * A count that other processes move for a while (sockets closing, fds of a takeover), read once it
 * held the same value for `holdMs`: that value. Throws naming `what` after `ms`.
 */
export async function steady(read: () => number, what: string, holdMs = 500, ms = 30_000): Promise<number> {
  const end = Date.now() + ms;
  let value = read();
  let since = Date.now();
  for (;;) {
    await new Promise((r) => setTimeout(r, 50));
    const now = read();
    if (now !== value) [value, since] = [now, Date.now()];
    else if (Date.now() - since >= holdMs) return value;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}: still moving, last ${value}`);
  }
}

/**
 * Whether process `pid` has ended: gone from /proc, or a zombie not yet reaped. Its stat may vanish
 * between any two reads (its parent reaps it), so a missing file is an answer, never an error.
 */
export function processEnded(pid: number): boolean {
  let stat: string;
  try {
    stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT' || (err as NodeJS.ErrnoException).code === 'ESRCH') return true;
    throw err;
  }
  return stat.slice(stat.lastIndexOf(')') + 2).startsWith('Z');
}
