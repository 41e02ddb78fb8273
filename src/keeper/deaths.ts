/**
 * How a serving process died, as the keeper counts it (docs/daemon.md "Crashes", docs/security.md
 * "The -u user ending the service"). A fault is the helper's own: a signal the kernel sends a process
 * for what it did (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGSYS, SIGTRAP, SIGXCPU, SIGXFSZ), SIGABRT
 * (raised by the process itself: Node's fatal errors, abort()), an exit code, or a SIGKILL while the
 * host's OOM kill counter moved, or a SIGALRM of its own loop watchdog (a SIGABRT or fault signal sent by
 * another process is ignored by the serving process: lifecycle/loop-watchdog.ts, ignoreSentFaults). Any other signal came from another process (a SIGKILL or SIGTERM of
 * the -u user, an operator): the keeper restarts it, backed off, without counting it toward the
 * crashes in a row that stop it.
 */
import fs from 'node:fs';

const FAULTS: ReadonlySet<string> = new Set([
  'SIGSEGV',
  'SIGBUS',
  'SIGILL',
  'SIGFPE',
  'SIGSYS',
  'SIGTRAP',
  'SIGXCPU',
  'SIGXFSZ',
  'SIGABRT',
]);

/** The host's OOM kills so far (`oom_kill` of /proc/vmstat, every memory cgroup's included), 0 when unknown. */
export function oomKills(vmstat = '/proc/vmstat'): number {
  try {
    const m = /^oom_kill (\d+)$/m.exec(fs.readFileSync(vmstat, 'utf8'));
    return m ? Number(m[1]) : 0;
  } catch {
    return 0;
  }
}

/**
 * A serving process's event loop tells the keeper it turns once a second (lifecycle/loop-watchdog.ts,
 * whose alarm ends a loop stalled for 10 s): silent for this long before a SIGALRM death, its loop
 * had stopped, and the alarm was its own watchdog's.
 */
export const WATCHDOG_SILENCE_MS = 5000;

/** What the keeper knew of the serving process when it died. */
interface DeathContext {
  /** The host's OOM kills when it was started (oomKills). */
  oomBefore: number;
  /** Milliseconds since the keeper last heard from it. */
  silentMs: number;
}

/**
 * Whether a death by `sig` came from another process: not a fault; for SIGKILL no OOM kill on the
 * host since it started (then the OOM killer may have sent it: counted as a crash); for SIGALRM a
 * loop that still turned (a silent one was ended by its own watchdog: a crash, a hang at every start
 * must reach the limit).
 */
export function endedFromOutside(sig: string, at: DeathContext, vmstat?: string): boolean {
  if (FAULTS.has(sig)) return false;
  if (sig === 'SIGALRM') return at.silentMs < WATCHDOG_SILENCE_MS;
  return sig !== 'SIGKILL' || oomKills(vmstat) === at.oomBefore;
}

/**
 * A serving process silent for this long is looked at (/proc/<pid>/stat): stopped (state T: a
 * SIGSTOP or SIGTSTP, which any process of -u's user may send) it is continued, so its watchdog's
 * alarm (10 s) does not end it for a hang it did not have.
 */
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
