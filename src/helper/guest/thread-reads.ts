/**
 * A VM's threads as QEMU's vmsr thread reads them at a window's edges (docs/guest-energy.md, "Cost").
 * A held fd that fails is an exited thread: then read by path as QEMU does (another thread on the tid, or nothing).
 */
import fs from 'node:fs';
import { pread } from '../../os/libc/fds.js';
import { readProcFile } from '../../os/proc-file.js';
import { digits, readRunTime, SCHEDSTAT_BYTES } from '../../os/schedstat-gate.js';
import { parseStatLine } from '../../ratio/stat.js';
import type { ThreadRead, ThreadSnapshot } from '../../guest-energy/guest-counter.js';

/** The sampler's open fds of a thread (-1: none; ProcTaskReader.heldFds), valid only in the turn of the event loop that asked. */
export type HeldFds = (pid: number, tid: number) => { stat: number; schedstat: number } | undefined;

/** A window's edge read: the threads, and per thread the run time read just before its line (null: not known, or R). */
export interface StartRead {
  threads: ThreadSnapshot;
  runTimes: Map<number, string | null>;
}

type Reading = StartRead & { threads: Map<number, ThreadRead> };

const emptyRead = (): Reading => ({ threads: new Map(), runTimes: new Map() });

function put(out: Reading, t: ThreadRead, runTime: string | null): void {
  out.threads.set(t.tid, t);
  out.runTimes.set(t.tid, runTime);
}

/** Upper bound of a stat line (as the sampler's). */
const STAT_BYTES = 4096;

export class ThreadReads {
  private readonly stat = Buffer.alloc(STAT_BYTES);
  private readonly sched = Buffer.alloc(SCHEDSTAT_BYTES);

  constructor(
    private readonly procRoot: string,
    private readonly pkgOfCpu: ReadonlyMap<number, number>,
    private readonly maxThreads: number,
    private readonly held: HeldFds = () => undefined,
  ) {}

  /** For readStart to keep; those gone or unreadable left out. */
  readEarly(pid: number, tids: Iterable<number>): StartRead {
    const out = emptyRead();
    for (const tid of tids) if (tid !== pid) this.readInto(out, pid, tid);
    return out;
  }

  /** Every thread but the main one (those of `early` as read then); null: gone or too many threads (answered raw). */
  readStart(pid: number, early?: StartRead, last?: { read: StartRead; count: number }): StartRead | null {
    if (last !== undefined && last.count === last.read.threads.size + 1) {
      const again = this.rereadStart(pid, early, last.read);
      if (again !== null) return again;
    }
    let tids: string[];
    try {
      tids = fs.readdirSync(`${this.procRoot}/${pid}/task`);
    } catch {
      return null;
    }
    if (tids.length > this.maxThreads) return null;
    const out = emptyRead();
    for (const name of tids) {
      const tid = Number(name);
      if (!Number.isSafeInteger(tid) || tid === pid) continue;
      const before = early?.threads.get(tid);
      if (before === undefined) this.readInto(out, pid, tid);
      else put(out, before, early!.runTimes.get(tid) ?? null);
    }
    return out;
  }

  /** The threads of `last` again through their held fds (bound to the thread); null when one is gone (then list). */
  private rereadStart(pid: number, early: StartRead | undefined, last: StartRead): StartRead | null {
    const out = emptyRead();
    if (early !== undefined) for (const tid of early.threads.keys()) if (!last.threads.has(tid)) return null;
    for (const [tid, a] of last.threads) {
      const e = early?.threads.get(tid);
      if (e !== undefined) put(out, e, early!.runTimes.get(tid) ?? null);
      else if (this.held(pid, tid) === undefined) return null;
      else this.readInto(out, pid, tid, a, last.runTimes.get(tid));
      if (!out.threads.has(tid)) return null;
    }
    return out;
  }

  /** `before` (with its run time) stands when its run time has not moved (the thread gate). */
  private readInto(out: Reading, pid: number, tid: number, before?: ThreadRead, beforeRunTime?: string | null): void {
    const fds = this.held(pid, tid);
    const runTime = fds !== undefined ? this.runTime(fds.schedstat) : null;
    if (before !== undefined && runTime !== null && runTime === beforeRunTime) return put(out, before, runTime);
    const read = this.readThread(pid, tid, fds?.stat ?? -1);
    if (read !== null) put(out, read.thread, read.running ? null : runTime);
  }

  /** The threads of a window's start read as QEMU reads them at its end (absent: exited). */
  readEnd(pid: number, start: StartRead): StartRead {
    const out = emptyRead();
    for (const a of start.threads.values()) this.readInto(out, pid, a.tid, a, start.runTimes.get(a.tid));
    return out;
  }

  /** A thread's run time (ns) through the sampler's held fd; null when none is held or it exited. */
  runTimeNs(pid: number, tid: number): number | null {
    const fd = this.held(pid, tid)?.schedstat ?? -1;
    const len = fd >= 0 ? readRunTime(fd, this.sched) : 0;
    return len > 0 ? digits(this.sched, 0, len) : null;
  }

  /** The run time (ns) of `pid`'s main thread (by path); null when unreadable or running (its run time lags then). */
  mainRunNs(pid: number): number | null {
    try {
      const st = parseStatLine(readProcFile(`${this.procRoot}/${pid}/task/${pid}/stat`).trimEnd());
      if (!st.ok || st.value.state === 'R') return null;
      const m = /^(\d+) /.exec(readProcFile(`${this.procRoot}/${pid}/task/${pid}/schedstat`));
      return m !== null ? Number(m[1]) : null;
    } catch {
      return null;
    }
  }

  private runTime(fd: number): string | null {
    const len = fd >= 0 ? readRunTime(fd, this.sched) : 0;
    return len > 0 ? this.sched.toString('latin1', 0, len) : null;
  }

  /** One thread's stat: through its held fd, else (none, or it failed) by path as QEMU opens it; null: gone or unparsable. */
  private readThread(pid: number, tid: number, fd: number): { thread: ThreadRead; running: boolean } | null {
    let line: string | null = null;
    if (fd >= 0) {
      const n = pread(fd, this.stat, STAT_BYTES, 0);
      if (n > 0 && n < STAT_BYTES) line = this.stat.toString('latin1', 0, n);
    }
    if (line === null) {
      try {
        line = readProcFile(`${this.procRoot}/${pid}/task/${tid}/stat`);
      } catch {
        return null;
      }
    }
    const st = parseStatLine(line.trimEnd());
    if (!st.ok || st.value.tid !== tid) return null;
    const v = st.value;
    const thread = { tid, ticks: v.utime + v.stime, starttime: v.starttime, pkg: this.pkgOfCpu.get(v.processor) ?? -1 };
    return { thread, running: v.state === 'R' };
  }
}
