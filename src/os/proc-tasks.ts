/**
 * The stat lines of registered VMs' threads every interval, cheaply (docs/daemon.md, "Sampling cost"): stat fds stay open
 * and are pread again (procfs regenerates the file each read), the task directory is listed only when the thread set may
 * have changed, and a process whose CPU clock (PidState) or a thread whose schedstat run time (ThreadState) did not move
 * gets its lines as last read. Gone (ENOENT, ESRCH): absent; any other failure stays in its process: one read before goes
 * on from the threads it kept (notWhole()), one never read gets a TaskReadError. A process over its KeptFdLedger grant
 * gets no new thread until forgotten: a late one would bring its life's CPU time into one interval ("File descriptors").
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { statNumThreads } from '../ratio/stat.js';
import { cannot } from '../common/errors.js';
import { errnoName } from './libc/errno.js';
import { closeFd, pread } from './libc/fds.js';
import { processCpuTimeNs } from './libc/processes.js';
import { digits, readRunTime, SCHEDSTAT_BYTES } from './schedstat-gate.js';

/** A /proc read that failed for a reason other than the thread or process being gone. */
export class TaskReadError extends Error {
  constructor(
    readonly file: string,
    readonly code: string,
  ) {
    super(
      cannot(
        `read ${file}`,
        `${code}${outOfFds(code) ? ' (out of file descriptors; the VM stays registered and sampling resumes once fds are free)' : ''}`,
      ),
    );
    this.name = 'TaskReadError';
  }
}

const { ENOENT, ESRCH } = os.constants.errno;
const outOfFds = (code: string): boolean => code === 'EMFILE' || code === 'ENFILE';
const codeOf = (e: unknown): string => (e as NodeJS.ErrnoException).code ?? (e as Error).message;
const isGone = (e: unknown): boolean => codeOf(e) === 'ENOENT' || codeOf(e) === 'ESRCH';

/** Upper bound of a stat line: 52 numeric fields of at most 20 digits plus a 64-byte comm. */
const BUF_SIZE = 4096;

/**
 * A line served by a gate this many times in a row is read anyway (bounds how old unused fields get in a trace). Counts
 * start at 0..28 in turn, so one scan's VMs do not all read in one interval (500 VMs × 8 threads: 30 ms, not 5).
 */
export const MAX_GATED_READS = 29;
/** A thread whose gate opened this many intervals in a row runs every interval: its line is read unprobed DIRECT_READS times. */
const BUSY_PROBES = 2;
const DIRECT_READS = 14;

const CLOSE_PAREN = 0x29;
const RUNNING = 0x52; // 'R'

/** A thread: its line is served again while its schedstat run time is the one read just before it (os/schedstat-gate.ts). */
interface ThreadState {
  fd: number;
  /** schedstat fd; -1 for the main thread (always read) or when the kernel has none. */
  sfd: number;
  /** The last line (no newline) and its bytes. */
  line: string | null;
  bytes: Buffer | null;
  /** That run time (ns) exactly: its decimal digits but the last 9, and those 9. runtimeHi -1: not known. */
  runtimeHi: number;
  runtimeLo: number;
  /** The last line's state was R: its run time may lag (nohz_full): read every time. */
  running: boolean;
  gated: number;
  /** Probes in a row that found it had run; reads left that skip the probe. */
  moved: number;
  direct: number;
}

/**
 * The process gate: `cpuNs`, its CPU clock read before the last full read, unchanged means no thread ran, was born or
 * ended since (each runs to do so): every line is as it was. A reused pid would need the same CPU time to the ns.
 */
interface PidState {
  pid: number;
  threads: Map<number, ThreadState>;
  numThreads: number;
  readsSinceList: number;
  cpuNs: bigint;
  /** A thread was running (state R) at the last read: the clock may lag (nohz_full), no gate. */
  running: boolean;
  gated: number;
  lastOut: Map<number, string> | null;
  /** Over its share of fds: no thread added, the task directory no longer listed. */
  frozen: boolean;
  /** The last listing could not open every new thread (out of fds): tried again at the next read. */
  short: boolean;
  /** Threads when last counted (num_threads, or the last listing). */
  listed: number;
}

/** Who says how many fds a process may keep (budget/vm-fd-shares.ts): each is granted before it is kept. */
export interface KeptFdLedger {
  /** How many of `n` more fds `pid` may keep now: at least `atLeast` (its main thread), at most `n`. */
  grant(pid: number, n: number, atLeast: number): number;
  /** `pid` closed `n` fds it was granted. */
  release(pid: number, n: number): void;
}

/** A process not sampled whole: 'share': over what it may keep (for good); 'fds': the helper ran out of fds at its last listing. */
export interface NotWhole {
  threads: number;
  sampled: number;
  why: 'share' | 'fds';
}

interface ProcTaskReaderOptions {
  /** List /proc/<pid>/task at least every this many reads, even when nothing hints at a change. */
  relistEvery?: number;
  /** Use the schedstat gate (default true). */
  gate?: boolean;
  /** Absent: a process keeps an fd for each of its threads. */
  ledger?: KeptFdLedger;
}

/** Fds kept for a process of `threads` threads (gate on): a stat fd each, a schedstat fd each but the main thread. */
export function keptFds(threads: number): number {
  return threads + Math.max(0, threads - 1);
}

export class ProcTaskReader {
  private readonly pids = new Map<number, PidState>();
  /** Where the next count of gated reads starts (see MAX_GATED_READS). */
  private phase = 0;
  private readonly buf = Buffer.alloc(BUF_SIZE);
  private readonly sbuf = Buffer.alloc(SCHEDSTAT_BYTES);
  private readonly relistEvery: number;
  private readonly gate: boolean;
  /** The process gate: on only when procRoot's pids are ours (the clock is read by pid, in our namespace). */
  private readonly clockGate: boolean;
  private readonly ledger: KeptFdLedger | undefined;
  /** What the reads cost so far (tests and the bench): stat files read, schedstat probes, lines served by each gate, listings. */
  readonly cost = { statReads: 0, probes: 0, gatedReads: 0, gatedProcessReads: 0, listings: 0 };

  constructor(
    private readonly procRoot: string,
    opts: ProcTaskReaderOptions = {},
  ) {
    this.relistEvery = Math.max(1, opts.relistEvery ?? 30);
    this.gate = opts.gate ?? true;
    this.clockGate = this.gate && pidsAreOurs(procRoot);
    this.ledger = opts.ledger;
  }

  /** Null when `pid` was sampled whole at its last read (or is not read). */
  notWhole(pid: number): NotWhole | null {
    const st = this.pids.get(pid);
    if (st === undefined || !(st.frozen || st.short)) return null;
    return { threads: Math.max(st.listed, st.threads.size), sampled: st.threads.size, why: st.frozen ? 'share' : 'fds' };
  }

  get openFds(): number {
    let n = 0;
    for (const s of this.pids.values()) for (const t of s.threads.values()) n += t.sfd >= 0 ? 2 : 1;
    return n;
  }

  /** tid -> stat line (no newline), exited threads left out; null when the process is gone. Unchanged: the previous map (do not modify). */
  read(pid: number): Map<number, string> | null {
    try {
      return this.readOnce(pid);
    } catch (e) {
      // A process read before: its lines as last read (no tick moves this interval), not whole.
      const st = this.pids.get(pid);
      if (!(e instanceof TaskReadError) || st === undefined || st.lastOut === null) throw e;
      st.short = true;
      st.cpuNs = -1n;
      return st.lastOut;
    }
  }

  private readOnce(pid: number): Map<number, string> | null {
    if (!Number.isSafeInteger(pid) || pid <= 0) return null;
    let st = this.pids.get(pid);
    if (st === undefined) {
      st = {
        pid,
        threads: new Map(),
        numThreads: -1,
        readsSinceList: 0,
        cpuNs: -1n,
        running: false,
        gated: 0,
        lastOut: null,
        frozen: false,
        short: false,
        listed: 0,
      };
      this.pids.set(pid, st);
      try {
        if (!this.list(pid, st)) return this.gone(pid);
      } catch (e) {
        this.forget(pid); // never read: nothing of it is kept
        throw e;
      }
    }
    // The clock first: the lines read after it are at least as new.
    const cpuNs = this.clockGate ? processCpuTimeNs(pid) : -1n;
    if (cpuNs >= 0n && cpuNs === st.cpuNs && st.lastOut !== null && !st.running && st.gated < MAX_GATED_READS) {
      st.gated++;
      this.cost.gatedProcessReads++;
      return st.lastOut;
    }
    // The leader's fd is bound to its process: failing means it is gone (a reused pid is another). Its line says how many threads.
    let main = this.readMain(st);
    if (main === null) return this.gone(pid);
    const n = statNumThreads(main);
    if (n > 0) st.listed = n;
    st.readsSinceList++;
    let relist = n !== st.numThreads || st.readsSinceList >= this.relistEvery || st.threads.size !== n;
    // After MAX_GATED_READS answers from the process gate, every line is read (the same bound as a thread's).
    const force = st.gated >= MAX_GATED_READS;
    st.gated = st.lastOut === null ? this.nextPhase() : 0;
    for (let attempt = 0; attempt < 2; attempt++) {
      if (relist) {
        if (!this.list(pid, st)) return this.gone(pid);
        if (attempt > 0 || !st.threads.has(pid)) {
          main = this.readMain(st);
          if (main === null) return this.gone(pid);
        }
      }
      const out = new Map<number, string>();
      out.set(pid, main);
      let failed = false;
      for (const [tid, t] of st.threads) {
        if (tid === pid) continue;
        const line = force ? this.readLine(st, tid, t) : this.readThread(st, tid, t);
        if (line === null) failed = true;
        else out.set(tid, line);
      }
      // A thread that ended may have been replaced by a new one with the count unchanged: list once more.
      if (!failed || attempt > 0) {
        st.lastOut = out;
        // A listing cut short (out of fds) left threads unread: no process gate until one is whole.
        st.cpuNs = failed || st.short ? -1n : cpuNs;
        st.running = false;
        for (const t of st.threads.values()) if (t.running) st.running = true;
        return out;
      }
      relist = true;
    }
    return null; // not reached
  }

  /** A thread's stat and schedstat fds (-1: none), for helper/guest/thread-reads.ts: valid only this event-loop turn. */
  heldFds(pid: number, tid: number): { stat: number; schedstat: number } | undefined {
    const t = this.pids.get(pid)?.threads.get(tid);
    return t === undefined ? undefined : { stat: t.fd, schedstat: t.sfd };
  }

  forget(pid: number): void {
    const st = this.pids.get(pid);
    if (st === undefined) return;
    for (const t of st.threads.values()) this.closeThread(pid, t);
    this.pids.delete(pid);
  }

  close(): void {
    for (const pid of [...this.pids.keys()]) this.forget(pid);
  }

  private gone(pid: number): null {
    this.forget(pid);
    return null;
  }

  private readMain(st: PidState): string | null {
    const t = st.threads.get(st.pid);
    return t === undefined ? null : this.readLine(st, st.pid, t);
  }

  private readThread(st: PidState, tid: number, t: ThreadState): string | null {
    if (t.sfd < 0 || t.running || t.direct > 0) {
      if (t.direct > 0) t.direct--;
      t.runtimeHi = -1; // this line is not tied to a run time: the next probe reads the line again
      return this.readLine(st, tid, t);
    }
    this.cost.probes++;
    const len = readRunTime(t.sfd, this.sbuf);
    if (len < 0) {
      this.failed(st, tid, 'schedstat', -len);
      this.drop(st, tid, t);
      return null;
    }
    const hi = len > 9 ? digits(this.sbuf, 0, len - 9) : 0;
    const lo = len > 0 ? digits(this.sbuf, Math.max(0, len - 9), len) : 0;
    const same = len > 0 && hi === t.runtimeHi && lo === t.runtimeLo;
    if (same) {
      t.moved = 0;
      if (t.line !== null && t.gated < MAX_GATED_READS) {
        // Not run since its line was read: the same line.
        this.cost.gatedReads++;
        t.gated++;
        return t.line;
      }
    } else {
      // It ran (or its run time was not known): the run time now, then the line, printed at this run time or later.
      if (t.runtimeHi >= 0 && ++t.moved >= BUSY_PROBES) {
        t.moved = 0;
        t.direct = DIRECT_READS;
      }
      t.runtimeHi = len > 0 ? hi : -1;
      t.runtimeLo = lo;
    }
    return this.readLine(st, tid, t);
  }

  private readLine(st: PidState, tid: number, t: ThreadState): string | null {
    this.cost.statReads++;
    t.gated = t.line === null ? this.nextPhase() : 0;
    const n = pread(t.fd, this.buf, BUF_SIZE, 0);
    if (n <= 0) {
      if (n < 0) this.failed(st, tid, 'stat', -n);
      this.drop(st, tid, t);
      return null;
    }
    let end = n;
    if (this.buf[end - 1] === 0x0a) end--;
    if (this.gate) t.running = isRunning(this.buf, end);
    const last = t.line;
    if (last !== null && last.length === end && this.buf.compare(t.bytes!, 0, end, 0, end) === 0) return last;
    const line = this.buf.toString('latin1', 0, end);
    if (t.bytes === null || t.bytes.length < end) t.bytes = Buffer.allocUnsafe(end + 32); // room for counters that grow a digit
    this.buf.copy(t.bytes, 0, 0, end);
    t.line = line;
    return line;
  }

  private nextPhase(): number {
    this.phase = (this.phase + 1) % MAX_GATED_READS;
    return this.phase;
  }

  private failed(st: PidState, tid: number, file: string, errno: number): void {
    if (errno === ENOENT || errno === ESRCH) return;
    throw new TaskReadError(path.join(this.procRoot, String(st.pid), 'task', String(tid), file), errnoName(errno));
  }

  private drop(st: PidState, tid: number, t: ThreadState): void {
    this.closeThread(st.pid, t);
    st.threads.delete(tid);
  }

  private closeThread(pid: number, t: ThreadState): void {
    closeFd(t.fd);
    if (t.sfd >= 0) closeFd(t.sfd);
    this.ledger?.release(pid, t.sfd >= 0 ? 2 : 1);
  }

  /** Syncs the open fds with /proc/<pid>/task; false when the process is gone. Frozen: not listed (an ended thread's read drops it). */
  private list(pid: number, st: PidState): boolean {
    if (st.frozen) return st.threads.has(pid);
    this.cost.listings++;
    st.readsSinceList = 0;
    const dir = path.join(this.procRoot, String(pid), 'task');
    const hadThreads = st.threads.has(pid);
    let names: string[];
    try {
      names = fs.readdirSync(dir);
    } catch (e) {
      if (isGone(e)) return false;
      if (hadThreads && outOfFds(codeOf(e))) {
        st.short = true;
        return true;
      }
      throw new TaskReadError(dir, codeOf(e));
    }
    const present = new Set<number>();
    const fresh: number[] = [];
    for (const name of names) {
      if (!/^\d+$/.test(name)) continue;
      const tid = Number(name);
      present.add(tid);
      if (!st.threads.has(tid)) fresh.push(tid);
    }
    // The main thread first (always kept: it says whether the process lives), then ascending tid.
    fresh.sort((a, b) => (a === pid ? -1 : b === pid ? 1 : a - b));
    if (this.openThreads(st, dir, fresh, present, hadThreads)) return true;
    st.short = false;
    for (const [tid, t] of st.threads) if (!present.has(tid)) this.drop(st, tid, t);
    st.numThreads = st.threads.size;
    st.listed = present.size;
    return st.threads.has(pid) || present.size > 0;
  }

  /**
   * Opens each new thread's fds as far as the ledger grants (beyond: frozen); one ended meanwhile leaves `present`. Out of
   * fds: what this listing opened is given back; true (short) when the process had threads, else TaskReadError.
   */
  private openThreads(st: PidState, dir: string, fresh: number[], present: Set<number>, hadThreads: boolean): boolean {
    const pid = st.pid;
    const cost = (tid: number) => (this.gate && tid !== pid ? 2 : 1);
    let granted = Infinity;
    if (this.ledger !== undefined && fresh.length > 0) {
      let want = 0;
      for (const tid of fresh) want += cost(tid);
      granted = this.ledger.grant(pid, want, fresh[0] === pid ? 1 : 0);
    }
    const opened: number[] = [];
    const giveBack = () => {
      if (this.ledger !== undefined && Number.isFinite(granted) && granted > 0) this.ledger.release(pid, granted);
      granted = 0;
    };
    for (const tid of fresh) {
      const need = cost(tid);
      if (need > granted) {
        // Over its share: sampled from what it keeps, for good (see the file comment).
        st.frozen = true;
        break;
      }
      granted -= need;
      let file = path.join(dir, String(tid), 'stat');
      try {
        const t = newThread(fs.openSync(file, fs.constants.O_RDONLY));
        st.threads.set(tid, t);
        opened.push(tid);
        if (need === 2) {
          file = path.join(dir, String(tid), 'schedstat');
          t.sfd = openSchedstat(file);
          if (t.sfd < 0) this.ledger?.release(pid, 1);
        }
      } catch (e) {
        // What was granted for this thread and not kept: all of it, or its schedstat fd's part.
        this.ledger?.release(pid, st.threads.has(tid) ? need - 1 : need);
        if (isGone(e)) {
          const t = st.threads.get(tid);
          if (t !== undefined) this.drop(st, tid, t);
          present.delete(tid); // exited between the listing and the open
          continue;
        }
        giveBack();
        // Out of fds (or worse): give back what this listing took, so the shortage is not ours to prolong.
        for (const o of opened) {
          const t = st.threads.get(o);
          if (t !== undefined) this.drop(st, o, t);
        }
        if (hadThreads && outOfFds(codeOf(e))) {
          st.short = true;
          st.numThreads = st.threads.size;
          return true;
        }
        throw new TaskReadError(file, codeOf(e));
      }
    }
    giveBack();
    return false;
  }
}

/** Whether `procRoot`'s pids are our namespace's (its `self` is us): else a CPU clock read by pid is another process's. */
function pidsAreOurs(procRoot: string): boolean {
  try {
    return fs.readlinkSync(path.join(procRoot, 'self')) === String(process.pid);
  } catch {
    return false;
  }
}

/** Where a stat line's last ')' can be (none follows comm): after the pid (7 digits, pid_max 2^22) and a comm of 64 bytes (workqueue worker). */
const COMM_END_MAX = 7 + 2 + 64 + 1;

/** The line's state (field 3, after the last ')') is R. */
function isRunning(b: Buffer, end: number): boolean {
  for (let i = Math.min(end, COMM_END_MAX) - 1; i > 0; i--) if (b[i] === CLOSE_PAREN) return i + 2 < end && b[i + 2] === RUNNING;
  return false;
}

function newThread(fd: number): ThreadState {
  return { fd, sfd: -1, line: null, bytes: null, runtimeHi: -1, runtimeLo: 0, running: false, gated: 0, moved: 0, direct: 0 };
}

/** fd of a thread's schedstat; -1 when the kernel has none (no CONFIG_SCHED_INFO: the stat is read every time). */
function openSchedstat(file: string): number {
  try {
    return fs.openSync(file, fs.constants.O_RDONLY);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT' && fs.existsSync(path.dirname(file))) return -1;
    throw e;
  }
}
