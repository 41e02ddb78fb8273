/**
 * File descriptors, THE one budget: one per connection and about two per thread of each VM's
 * process (keptFds). The soft RLIMIT_NOFILE is raised to the hard limit, connections are capped, and
 * a VM is admitted only when its threads fit beside every connection slot and the reserve (canAdmit).
 */
import fs from 'node:fs';
import { getrlimit, RLIMIT_NOFILE, setrlimit } from '../os/libc/processes.js';
import { keptFds } from '../os/proc-tasks.js';
import { fail, ok, type Result } from '../common/result.js';

/** fds kept free for what is opened briefly: a /proc listing, a pidfile, a log, an MSR device of a new CPU. */
export const FD_RESERVE = 32;

/** How old a count of the open fds usage() (read at every sample) may report: a count costs ~1 µs per fd. */
const FD_USAGE_MAX_AGE_MS = 10_000;

/** Fds one VM costs: what the sampler keeps open for its threads, plus the directory fd of a /proc/<pid>/task listing. */
export function vmFds(threads: number): number {
  return keptFds(threads) + 1;
}

/** Raises the soft RLIMIT_NOFILE to the hard limit (capped by fs.nr_open when the hard one is infinite). */
export function raiseFdLimit() {
  const before = getrlimit(RLIMIT_NOFILE);
  const target = before.hard === Infinity ? nrOpen() : before.hard;
  if (before.soft >= target) return { before, after: before };
  try {
    setrlimit(RLIMIT_NOFILE, { soft: target, hard: before.hard });
  } catch (e) {
    return { before, after: before, error: (e as Error).message };
  }
  return { before, after: getrlimit(RLIMIT_NOFILE) };
}

function nrOpen(): number {
  try {
    const n = Number(fs.readFileSync('/proc/sys/fs/nr_open', 'utf8').trim());
    return Number.isSafeInteger(n) && n > 0 ? n : 1 << 20;
  } catch {
    return 1 << 20;
  }
}

/** Fds open in this process now (one readdir of /proc/self/fd; its own fd not counted). */
export function countOpenFds(): number {
  return fs.readdirSync('/proc/self/fd').length - 1;
}

/** --max-connections, lowered when the fd limit cannot hold that many beside the reserve and the VMs. */
export function effectiveMaxConnections(maxConnections: number, limit: number, openNow: number): number {
  const half = Math.floor((limit - openNow - FD_RESERVE) / 2);
  return Math.max(1, Math.min(maxConnections, half));
}

/** Fds open, the limit, and what may still be opened beside every connection slot and the reserve. */
export interface FdUsage {
  open: number;
  max: number;
  available: number;
}

/** Room for a VM's fds, or why not (a message naming the fix). */
export type FdAdmission = Result<void>;

interface FdBudgetOptions {
  /** The soft RLIMIT_NOFILE (after raising). */
  limit: number;
  /** The effective --max-connections. */
  maxConnections: number;
  openConnections: () => number;
  /** The exact count of fds open now, asked at every check (default: counted once per event-loop turn). */
  openFds?: () => number;
}

export class FdBudget {
  /** The count of this turn, plus what this budget let open since (null: not counted yet this turn). */
  private turn: { open: number; atMs: number } | null = null;
  /** The last turn's count (what it let open included), for usage(). */
  private last: { open: number; atMs: number } | null = null;
  private readonly openNow: () => number;

  constructor(private readonly o: FdBudgetOptions) {
    this.openNow = o.openFds ?? (() => this.countedThisTurn());
  }

  /**
   * Fds open now, read from /proc/self/fd once per event-loop turn: a burst in one turn (a scan admitting 500 VMs)
   * would otherwise be quadratic. What the turn admits is added to the count, which so never runs behind.
   */
  private countedThisTurn(): number {
    if (this.turn === null) {
      this.turn = this.last = { open: countOpenFds(), atMs: Date.now() };
      setImmediate(() => (this.turn = null)).unref();
    }
    return this.turn.open;
  }

  /** `n` fds were admitted (or granted: VmFdShares): counted as open until the next turn's count. */
  admitted(n: number): void {
    if (this.turn !== null) this.turn.open += n;
  }

  /** For the host statistics file: from this turn's count, or the last one under FD_USAGE_MAX_AGE_MS old. */
  usage(): FdUsage {
    const recent =
      this.o.openFds === undefined && this.turn === null && this.last !== null && Date.now() - this.last.atMs < FD_USAGE_MAX_AGE_MS;
    const { open, room } = this.space(recent ? this.last!.open : undefined);
    return { open, max: this.o.limit, available: Math.max(0, room) };
  }

  /** Fds that may still be opened now beside every connection slot and the reserve (can be 0). */
  room(): number {
    return Math.max(0, this.space().room);
  }

  /** What the VMs' fds may take in all: what the per-uid shares divide. */
  get vmCapacity(): number {
    return Math.max(0, this.o.limit - this.o.maxConnections - FD_RESERVE);
  }

  canOpen(n: number, what: string): FdAdmission {
    return this.fit(n, `${what} needs ${n}`);
  }

  /** Whether a VM of `threads` threads fits; not counted as open: VmFdShares.grant counts each fd it grants. */
  canAdmit(threads: number): FdAdmission {
    const need = vmFds(Math.max(1, threads));
    return this.fit(need, `its ${threads} threads need ${need}`, false);
  }

  /** The limit minus the fds open now, the free connection slots and the reserve (may be negative). */
  private space(counted?: number): { open: number; freeSlots: number; room: number } {
    const open = counted ?? this.openNow();
    const freeSlots = Math.max(0, this.o.maxConnections - this.o.openConnections());
    return { open, freeSlots, room: this.o.limit - open - freeSlots - FD_RESERVE };
  }

  private fit(need: number, needs: string, count = true): FdAdmission {
    const { open, freeSlots, room } = this.space();
    if (need <= room) {
      if (count) this.admitted(need);
      return ok(undefined);
    }
    return fail(
      `not enough file descriptors: ${needs}, ${Math.max(0, room)} are left ` +
        `(limit ${this.o.limit}, ${open} open, ${freeSlots} kept for connections, ${FD_RESERVE} reserved); ` +
        "raise the helper's open-file limit (LimitNOFILE=, ulimit -n) or lower --max-connections",
    );
  }
}
