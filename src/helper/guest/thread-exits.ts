/**
 * Whether a thread QEMU listed at a window's start may have exited (its tick delta underflows), by
 * identity, not by count (docs/guest-energy.md "Thread exits"). QEMU's own list is not seen: a thread
 * it may have listed and the helper missed counts as an exit unless it ran under a tick.
 */
import fs from 'node:fs';
import { closeFd, epollAdd, epollCreate, epollReadyNow } from '../../os/libc/fds.js';
import { gettid, pidfdOpenThread } from '../../os/libc/processes.js';
import type { KeptFdLedger } from '../../os/proc-tasks.js';
import type { StartRead } from './thread-reads.js';

export type ExitProbeKind = 'pidfd' | 'tasks';

export interface ExitOs {
  /** A pidfd of thread `tid` (PIDFD_THREAD), or -errno (ESRCH: gone). */
  pidfdOpenThread(tid: number): number;
  epollCreate(): number;
  epollAdd(epfd: number, fd: number, data: number): number;
  epollReadyNow(epfd: number): number[];
  close(fd: number): void;
  listTasks(pid: number): ReadonlySet<number> | null;
}

const ESRCH = 3;
/** Ready pidfds read at once: a full read may leave out an exit behind idle ones (idleAtList), so it counts as one. */
const READY_MAX = 16;
const READY_BUF = Buffer.alloc(12 * READY_MAX);

export function realExitOs(procRoot: string): ExitOs {
  return {
    pidfdOpenThread,
    epollCreate,
    epollAdd,
    epollReadyNow: (epfd) => epollReadyNow(epfd, READY_BUF),
    close: closeFd,
    listTasks(pid) {
      try {
        return new Set(fs.readdirSync(`${procRoot}/${pid}/task`).map(Number));
      } catch {
        return null;
      }
    },
  };
}

/** `pidfd` when this kernel gives pidfds of threads (Linux 6.9+), else `tasks`: asked once, of this thread. */
export function exitProbeKind(): ExitProbeKind {
  const fd = pidfdOpenThread(gettid());
  if (fd < 0) return 'tasks';
  closeFd(fd);
  return 'pidfd';
}

/** A window's start read against the helper's read before it (the last window's end read), `gapNs` apart. */
export interface WatchStart {
  tids: Iterable<number>;
  before?: ReadonlySet<number> | undefined;
  gapNs: number;
  /** The CPU time of the threads but the vCPUs between the two reads (ns), when known. */
  cpuNs?: number | undefined;
  /** Threads QEMU read 0 ticks of at its listing (idleAtList): their exit cannot underflow its tick delta. */
  idle?: ReadonlySet<number> | undefined;
}

/** What a thread unseen since the last read can have run (ns): the non-vCPU threads' time less the main thread's (never listed). */
export function unseenCpuNs(
  othersNow: number | undefined,
  othersThen: number | undefined,
  mainNow: number | null,
  mainThen: number | null | undefined,
): number | undefined {
  if (othersNow === undefined || othersThen === undefined) return undefined;
  const main = mainNow !== null && mainThen != null ? Math.max(0, mainNow - mainThen) : 0;
  return othersNow - othersThen - main;
}

/**
 * The threads QEMU read 0 ticks of at its listing (0 - 0 even if they exit): utime + stime never pass the run
 * time (cputime_adjust), so 0 ticks read after it (`leadNs` 0), or `leadNs` before it with run time + leadNs under a tick.
 */
export function idleAtList(read: StartRead, leadNs: number, tickNs: number): Set<number> {
  const idle = new Set<number>();
  for (const t of read.threads.values()) {
    if (t.ticks !== 0) continue;
    const run = read.runTimes.get(t.tid);
    if (leadNs <= 0 || (run != null && Number(run) + leadNs < tickNs)) idle.add(t.tid);
  }
  return idle;
}

export class ExitWatch {
  private readonly fds = new Map<number, number>();
  private epfd = -1;
  private listed: number[] = [];
  /** An exit known (or not excludable) since the window began. */
  private exit = false;
  private idle: ReadonlySet<number> = new Set();
  cause: 'no read before' | 'reads a tick apart' | 'gone since the read before' | 'gone at open' | 'pidfd' | 'not listed' | null = null;

  /** `probe`: `tasks` once the VM's fds could not be had. */
  constructor(
    private readonly pid: number,
    public probe: ExitProbeKind,
    private readonly o: { os: ExitOs; tickNs: number; ledger?: KeptFdLedger | undefined },
  ) {}

  begin(w: WatchStart): void {
    const tids = new Set(w.tids);
    this.idle = w.idle ?? new Set();
    // A thread unseen between the reads ran less than the time between them, and less than the CPU time all the
    // threads but the vCPUs had then: under a tick, QEMU read 0 ticks of it.
    const apart = w.gapNs >= this.o.tickNs && !(w.cpuNs !== undefined && w.cpuNs < this.o.tickNs);
    this.cause = w.before === undefined ? 'no read before' : apart ? 'reads a tick apart' : null;
    if (w.before !== undefined) for (const t of w.before) if (!tids.has(t)) this.cause ??= 'gone since the read before';
    this.exit = this.cause !== null;
    if (this.probe === 'pidfd' && this.watchAll(tids)) return;
    this.listed = [...tids];
  }

  /** Whether a thread of the window's start read may have exited by now (one epoll_wait, or one listing). */
  exited(): boolean {
    if (this.exit) return true;
    if (this.epfd >= 0) {
      const ready = this.o.os.epollReadyNow(this.epfd);
      this.exit = ready.length >= READY_MAX || ready.some((t) => !this.idle.has(t));
    } else {
      const now = this.o.os.listTasks(this.pid);
      this.exit = now === null || this.listed.some((t) => !now.has(t) && !this.idle.has(t));
    }
    if (this.exit) this.cause = this.epfd >= 0 ? 'pidfd' : 'not listed';
    return this.exit;
  }

  close(): void {
    for (const fd of this.fds.values()) this.o.os.close(fd);
    const n = this.fds.size + (this.epfd >= 0 ? 1 : 0);
    this.fds.clear();
    if (this.epfd >= 0) this.o.os.close(this.epfd);
    this.epfd = -1;
    if (n > 0) this.o.ledger?.release(this.pid, n);
  }

  /** The pidfds of `tids` (those of threads no longer listed closed): false when the VM's fd share cannot hold them. */
  private watchAll(tids: ReadonlySet<number>): boolean {
    // A pidfd readable now is of a thread that exited: closed, and opened again if its tid was read again (another thread).
    const exited = new Set(this.epfd >= 0 ? this.o.os.epollReadyNow(this.epfd) : []);
    for (const [tid, fd] of this.fds) {
      if (tids.has(tid) && !exited.has(tid)) continue;
      this.o.os.close(fd);
      this.fds.delete(tid);
      this.o.ledger?.release(this.pid, 1);
    }
    const add = [...tids].filter((t) => !this.fds.has(t));
    const need = add.length + (this.epfd < 0 ? 1 : 0);
    if (need === 0) return true;
    const got = this.o.ledger === undefined ? need : this.o.ledger.grant(this.pid, need, 0);
    if (got < need) {
      if (got > 0) this.o.ledger!.release(this.pid, got);
      return this.fallBack();
    }
    if (this.epfd < 0 && (this.epfd = this.o.os.epollCreate()) < 0) return this.fallBack(need);
    for (let i = 0; i < add.length; i++) {
      const tid = add[i]!;
      const fd = this.o.os.pidfdOpenThread(tid);
      if (fd >= 0 && this.o.os.epollAdd(this.epfd, fd, tid) === 0) {
        this.fds.set(tid, fd);
        continue;
      }
      if (fd >= 0) this.o.os.close(fd);
      this.o.ledger?.release(this.pid, 1);
      // Gone before it could be watched: an exit. Any other failure (out of fds): the task directory.
      if (fd === -ESRCH && !this.idle.has(tid)) [this.exit, this.cause] = [true, this.cause ?? 'gone at open'];
      else if (fd === -ESRCH) continue;
      else return this.fallBack(add.length - i - 1);
    }
    return true;
  }

  private fallBack(granted = 0): false {
    if (granted > 0) this.o.ledger?.release(this.pid, granted);
    this.close();
    this.probe = 'tasks';
    return false;
  }
}
