/**
 * Dropping every capability (and to -u/-g) once the MSR fds, socket and pidfile are open: the msr driver and powercap's
 * energy_uj check at open(2) only (docs/security.md "Privileges, per process and phase"). capset and the rest act on the
 * calling thread only, so as root the helper drops on the main thread and re-executes itself (reexec.ts).
 */
import fs from 'node:fs';
import { capget, capset, prctl, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, setgroups, setresgid, setresuid } from '../libc/capability-calls.js';

export const CAP_SETPCAP = 8;
const CAP_SYS_RAWIO = 17;
export const RAWIO_MASK = 1n << BigInt(CAP_SYS_RAWIO);
const PR_CAP_AMBIENT = 47;
const PR_CAP_AMBIENT_CLEAR_ALL = 4;
const PR_SET_SECUREBITS = 28;
/** SECBIT_NOROOT and NO_CAP_AMBIENT_RAISE on, KEEP_CAPS off, each locked: an exec by uid 0 gains nothing, nothing goes ambient. */
const LOCKED_SECUREBITS = 0x01 | 0x02 | 0x20 | 0x40 | 0x80;

interface DropOptions {
  uid?: number;
  gid?: number;
  /**
   * With `uid`: only the effective uid, real and saved stay 0 (the keeper's: no process of `uid` may signal it, as kill(2)
   * needs the sender's real or effective uid to be the target's real or saved one). No capability comes with it: takeOwnUid.
   */
  realUidRoot?: boolean;
}

interface DropReport {
  /** Steps that could not be done (the bounding set without CAP_SETPCAP). */
  skipped: string[];
}

function lastCap(): number {
  try {
    const n = Number(fs.readFileSync('/proc/sys/kernel/cap_last_cap', 'utf8').trim());
    return Number.isInteger(n) && n > 0 && n < 64 ? n : 40;
  } catch {
    return 40;
  }
}

function dropBoundingSet(): void {
  const last = lastCap();
  for (let cap = 0; cap <= last; cap++) {
    try {
      prctl(PR_CAPBSET_DROP, cap);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EINVAL') throw e;
    }
  }
}

/**
 * The calling thread's credentials down to nothing: bounding set emptied and securebits locked (with CAP_SETPCAP), ambient
 * set cleared, -g/-u (glibc broadcasts set*id), every capability 0, NO_NEW_PRIVS. Without a re-exec, other threads keep theirs.
 */
export function dropPrivileges(o: DropOptions): DropReport {
  const skipped: string[] = [];
  if ((capget().effective & (1n << BigInt(CAP_SETPCAP))) !== 0n) {
    dropBoundingSet();
    prctl(PR_SET_SECUREBITS, LOCKED_SECUREBITS);
  } else skipped.push('bounding set and securebits (no CAP_SETPCAP)');
  try {
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL);
  } catch {
    skipped.push('ambient set');
  }
  if (o.gid !== undefined) {
    setgroups([o.gid]);
    setresgid(o.gid);
  } else if (o.uid !== undefined) {
    setgroups([]); // never carry root's supplementary groups to another user
  }
  if (o.uid !== undefined) setresuid(o.uid, o.realUidRoot ? 0 : o.uid);
  capset({ effective: 0n, permitted: 0n, inheritable: 0n });
  prctl(PR_SET_NO_NEW_PRIVS, 1);
  return { skipped };
}

/**
 * The keeper's image, first thing: execve made its saved uid its effective one (-u's), which that uid's processes may signal;
 * its real uid is still 0 (DropOptions.realUidRoot), and an unprivileged setresuid may set the saved uid to it.
 */
export function savedUidRoot(): void {
  const euid = process.geteuid?.();
  if (euid !== undefined && euid !== 0 && process.getuid?.() === 0) setresuid(euid, 0);
}

/** A serving process the keeper started (DropOptions.realUidRoot) takes its effective uid as all three: the keeper alone keeps real uid 0. */
export function takeOwnUid(): void {
  const euid = process.geteuid?.();
  if (euid !== undefined && process.getuid?.() !== euid) setresuid(euid);
}
