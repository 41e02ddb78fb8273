/**
 * How a serving process died, as the keeper counts it (docs/security.md "The -u user ending the service"): a fault, SIGABRT, an
 * exit code, a SIGKILL while OOM kills moved, its watchdog's SIGALRM are its own (it ignores fault signals other processes send:
 * lifecycle/loop-watchdog.ts); any other signal came from another process: restarted, not counted.
 */
import fs from 'node:fs';

const FAULTS = new Set<string>(['SIGSEGV', 'SIGBUS', 'SIGILL', 'SIGFPE', 'SIGSYS', 'SIGTRAP', 'SIGXCPU', 'SIGXFSZ', 'SIGABRT']);

/** The host's OOM kills so far (`oom_kill` of /proc/vmstat, every memory cgroup's included), 0 when unknown. */
export function oomKills(vmstat = '/proc/vmstat'): number {
  try {
    const m = /^oom_kill (\d+)$/m.exec(fs.readFileSync(vmstat, 'utf8'));
    return m ? Number(m[1]) : 0;
  } catch {
    return 0;
  }
}

/** Silent this long before a SIGALRM death (its loop beats once a second), the alarm was its own watchdog's (10 s). */
export const WATCHDOG_SILENCE_MS = 5000;

/** Whether a death by `sig` came from another process: no fault, a SIGKILL with no OOM kill since `oomBefore`, a SIGALRM while the loop turned. */
export function endedFromOutside(sig: string, at: { oomBefore: number; silentMs: number }, vmstat?: string): boolean {
  if (FAULTS.has(sig)) return false;
  if (sig === 'SIGALRM') return at.silentMs < WATCHDOG_SILENCE_MS;
  return sig !== 'SIGKILL' || oomKills(vmstat) === at.oomBefore;
}

/** A serving process silent this long is continued if stopped (a SIGSTOP any process of -u's user may send), before its watchdog ends it. */
export const STOPPED_CHECK_AFTER_MS = 2000;

/** Whether `pid` is stopped by a signal (state T of /proc/<pid>/stat; not t, a debugger's: root only). */
export function stoppedBySignal(pid: number, proc = '/proc'): boolean {
  try {
    const stat = fs.readFileSync(`${proc}/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) === 'T';
  } catch {
    return false;
  }
}
