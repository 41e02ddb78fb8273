/**
 * Reads the /proc/<pid>/task/<tid>/stat lines of registered VMs every interval, cheaply: each thread's
 * stat file stays open and is re-read with pread at offset 0 (procfs regenerates it on every read),
 * and /proc/<pid>/task is listed only when the thread set may have changed. A vanished thread or
 * process (ENOENT, ESRCH) is never an error: it is simply absent. Any other failure (EMFILE when the
 * helper is out of file descriptors, ENOMEM, ...) says nothing about the process, so it is thrown as a
 * TaskReadError: the sample fails and is retried, and the VM is never taken for ended.
 */
import fs from 'node:fs';
import path from 'node:path';
import { statNumThreads } from '../ratio/stat.js';
import { cannot } from '../ratio/errors.js';

/** A /proc read that failed for a reason other than the thread or process being gone. */
export class TaskReadError extends Error {
  constructor(
    readonly file: string,
    readonly code: string,
  ) {
    super(cannot(`read ${file}`, `${code}${code === 'EMFILE' || code === 'ENFILE' ? ' (out of file descriptors; the VM stays registered and sampling resumes once fds are free)' : ''}`));
    this.name = 'TaskReadError';
  }
}

/** errno codes that mean "this thread or process no longer exists". */
function isGone(e: unknown): boolean {
  const code = (e as NodeJS.ErrnoException).code;
  return code === 'ENOENT' || code === 'ESRCH';
}

function codeOf(e: unknown): string {
  return (e as NodeJS.ErrnoException).code ?? (e as Error).message;
}


/** Upper bound of a stat line: 52 numeric fields of at most 20 digits plus a 64-byte comm. */
const BUF_SIZE = 4096;

/** A thread's last stat line, and its bytes to compare the next read with. */
interface LastLine {
  bytes: Buffer;
  line: string;
}

interface PidState {
  pid: number;
  /** tid -> fd of /proc/<pid>/task/<tid>/stat. The main thread's fd doubles as the liveness probe. */
  fds: Map<number, number>;
  /**
   * tid -> its last line: a thread whose line did not change since (an idle thread's does not) gets
   * the same string back, so an interval allocates text only for threads that moved.
   */
  last: Map<number, LastLine>;
  numThreads: number;
  readsSinceList: number;
}

export interface ProcTaskReaderOptions {
  /** List /proc/<pid>/task at least every this many reads, even when nothing hints at a change. */
  relistEvery?: number;
}

export class ProcTaskReader {
  private readonly pids = new Map<number, PidState>();
  private readonly buf = Buffer.alloc(BUF_SIZE);
  private readonly relistEvery: number;
  /** Directory listings done so far (for tests and benchmarks). */
  listings = 0;

  constructor(
    private readonly procRoot: string,
    opts: ProcTaskReaderOptions = {},
  ) {
    this.relistEvery = Math.max(1, opts.relistEvery ?? 30);
  }

  /** Number of stat fds held open (all pids). */
  get openFds(): number {
    let n = 0;
    for (const s of this.pids.values()) n += s.fds.size;
    return n;
  }

  /**
   * Every thread's stat line (no trailing newline), tid -> line; null when the process is gone.
   * Threads whose read fails mid-way (exited) are left out. Throws TaskReadError when a read fails
   * for another reason (see the file comment).
   */
  read(pid: number): Map<number, string> | null {
    if (!Number.isSafeInteger(pid) || pid <= 0) return null;
    let st = this.pids.get(pid);
    if (st === undefined) {
      st = { pid, fds: new Map(), last: new Map(), numThreads: -1, readsSinceList: 0 };
      this.pids.set(pid, st);
      if (!this.list(pid, st)) return this.gone(pid);
    }
    // The main thread's line says whether the process lives and how many threads it has now.
    let main = this.readFd(st, pid);
    if (main === null) {
      // The leader's fd is bound to the process it was opened for: failing means that process is gone
      // (a reused pid is another process, and is not ours).
      return this.gone(pid);
    }
    const n = statNumThreads(main);
    st.readsSinceList++;
    let relist = n !== st.numThreads || st.readsSinceList >= this.relistEvery || st.fds.size !== n;
    for (let attempt = 0; attempt < 2; attempt++) {
      if (relist) {
        if (!this.list(pid, st)) return this.gone(pid);
        if (attempt > 0 || !st.fds.has(pid)) {
          main = this.readFd(st, pid);
          if (main === null) return this.gone(pid);
        }
      }
      const out = new Map<number, string>();
      out.set(pid, main);
      let failed = false;
      for (const tid of st.fds.keys()) {
        if (tid === pid) continue;
        const line = this.readFd(st, tid);
        if (line === null) failed = true;
        else out.set(tid, line);
      }
      // A thread that ended may have been replaced by a new one with the count unchanged: list once more.
      if (!failed || attempt > 0) return out;
      relist = true;
    }
    return null; // not reached
  }

  /** Closes the fds of `pid`; the next read starts afresh. */
  forget(pid: number): void {
    const st = this.pids.get(pid);
    if (st === undefined) return;
    for (const fd of st.fds.values()) closeQuietly(fd);
    this.pids.delete(pid);
  }

  close(): void {
    for (const pid of [...this.pids.keys()]) this.forget(pid);
  }

  private gone(pid: number): null {
    this.forget(pid);
    return null;
  }

  /** pread of one thread's stat; on failure its fd is closed and dropped. */
  private readFd(st: PidState, tid: number): string | null {
    const fd = st.fds.get(tid);
    if (fd === undefined) return null;
    let n: number;
    try {
      n = fs.readSync(fd, this.buf, 0, BUF_SIZE, 0);
    } catch (e) {
      if (!isGone(e)) throw new TaskReadError(path.join(this.procRoot, String(st.pid), 'task', String(tid), 'stat'), codeOf(e));
      n = 0; // ESRCH / ENOENT: the thread is gone
    }
    if (n <= 0) {
      closeQuietly(fd);
      st.fds.delete(tid);
      st.last.delete(tid);
      return null;
    }
    let end = n;
    if (this.buf[end - 1] === 0x0a) end--;
    const last = st.last.get(tid);
    if (last !== undefined && last.line.length === end && this.buf.compare(last.bytes, 0, end, 0, end) === 0) return last.line;
    const line = this.buf.toString('latin1', 0, end);
    if (last !== undefined && last.bytes.length >= end) {
      this.buf.copy(last.bytes, 0, 0, end);
      last.line = line;
    } else {
      const bytes = Buffer.allocUnsafe(end + 32); // room for counters that grow a digit
      this.buf.copy(bytes, 0, 0, end);
      st.last.set(tid, { bytes, line });
    }
    return line;
  }

  /** Syncs the open fds with /proc/<pid>/task; false when the process is gone. */
  private list(pid: number, st: PidState): boolean {
    this.listings++;
    st.readsSinceList = 0;
    const dir = path.join(this.procRoot, String(pid), 'task');
    let names: string[];
    try {
      names = fs.readdirSync(dir);
    } catch (e) {
      if (isGone(e)) return false;
      throw new TaskReadError(dir, codeOf(e));
    }
    const present = new Set<number>();
    const opened: number[] = [];
    for (const name of names) {
      if (!/^\d+$/.test(name)) continue;
      const tid = Number(name);
      present.add(tid);
      if (st.fds.has(tid)) continue;
      try {
        st.fds.set(tid, fs.openSync(path.join(dir, name, 'stat'), fs.constants.O_RDONLY));
        opened.push(tid);
      } catch (e) {
        if (isGone(e)) {
          present.delete(tid); // exited between the listing and the open
          continue;
        }
        // Out of fds (or worse): give back what this listing took, so the shortage is not ours to prolong.
        for (const t of opened) {
          closeQuietly(st.fds.get(t)!);
          st.fds.delete(t);
        }
        throw new TaskReadError(path.join(dir, name, 'stat'), codeOf(e));
      }
    }
    for (const [tid, fd] of st.fds) {
      if (!present.has(tid)) {
        closeQuietly(fd);
        st.fds.delete(tid);
        st.last.delete(tid);
      }
    }
    st.numThreads = st.fds.size;
    return st.fds.has(pid) || present.size > 0;
  }
}

function closeQuietly(fd: number): void {
  try {
    fs.closeSync(fd);
  } catch {
    /* already closed */
  }
}
