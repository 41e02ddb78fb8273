/**
 * How a serving process died, as the keeper counts it (docs/daemon.md "Crashes", docs/security.md
 * "The -u user ending the service"). A fault is the helper's own: a signal the kernel sends a process
 * for what it did (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGSYS, SIGTRAP, SIGXCPU, SIGXFSZ), SIGABRT
 * (raised by the process itself: Node's fatal errors, abort()), an exit code, or a SIGKILL while the
 * host's OOM kill counter moved. Any other signal came from another process (a SIGKILL or SIGTERM of
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
 * Whether a death by `sig` came from another process: not a fault, and for SIGKILL no OOM kill on
 * the host since `oomBefore` (then the OOM killer may have sent it: counted as a crash).
 */
export function endedFromOutside(sig: string, oomBefore: number, vmstat?: string): boolean {
  if (FAULTS.has(sig)) return false;
  return sig !== 'SIGKILL' || oomKills(vmstat) === oomBefore;
}
