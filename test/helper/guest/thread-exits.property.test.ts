/**
 * Thread exits known by identity (helper/guest/thread-exits.ts) with the model's answers
 * (guest-counter.ts), on a simulated thread table: for any interleaving of
 * thread starts and exits around a window's reads (the helper's last read, QEMU's start listing,
 * the helper's start read, by the settling's read or after the start reply, and the end's reply),
 * either probe (pidfds or the task directory) and any room in the VM's fd share, the helper never
 * answers a non-zero delta for a window in which a thread QEMU listed, with ticks QEMU read at the
 * start, exited before the reply. (A thread QEMU read 0 ticks of cannot underflow: 0 - 0; and a
 * window whose only exits are of threads the helper's reads show QEMU read at 0 ticks is not
 * answered as one with an exit.)
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { ExitWatch, idleAtList, unseenCpuNs, type ExitOs, type ExitProbeKind } from '../../../src/helper/guest/thread-exits.js';
import { answerForecast, closeWindow, freshGuestCounter, type ThreadRead } from '../../../src/guest-energy/guest-counter.js';
import type { KeptFdLedger } from '../../../src/os/proc-tasks.js';

const PID = 100;
/** One clock tick (CLK_TCK 100), in the simulation's µs. */
const TICK = 10_000;
/** A window's events fall in [0, SPAN) µs, the helper's last read at 0. */
const SPAN = 40_000;
const MAX_TICKS = new Map([[0, 100]]);

interface Thread {
  tid: number;
  born: number;
  died: number;
  /** The share of a CPU it runs while alive. */
  rate: number;
  /** Its run time when born (µs): an old thread may have run before the window. */
  ran0: number;
}

/** A thread's run time at `at` (µs), and its ticks then (utime + stime never pass the run time). */
function runTime(t: Thread, at: number): number {
  return t.ran0 + t.rate * Math.max(0, Math.min(t.died, at) - t.born);
}
const ticksAt = (t: Thread, at: number) => Math.floor(runTime(t, at) / TICK);

/** The kernel as ExitWatch sees it, over the simulated threads at time `now`. */
class SimOs implements ExitOs {
  now = 0;
  private nextFd = 3;
  readonly open = new Map<number, number>();
  private readonly sets = new Map<number, Map<number, number>>();
  constructor(private readonly threads: readonly Thread[]) {}
  private alive(tid: number): boolean {
    const t = this.threads.find((x) => x.tid === tid);
    return t !== undefined && t.born <= this.now && this.now < t.died;
  }
  pidfdOpenThread(tid: number): number {
    if (!this.alive(tid)) return -3;
    const fd = this.nextFd++;
    this.open.set(fd, tid);
    return fd;
  }
  epollCreate(): number {
    const fd = this.nextFd++;
    this.sets.set(fd, new Map());
    this.open.set(fd, -1);
    return fd;
  }
  epollAdd(epfd: number, fd: number, data: number): number {
    this.sets.get(epfd)!.set(fd, data);
    return 0;
  }
  epollReadyNow(epfd: number): number[] {
    const out: number[] = [];
    for (const [fd, data] of this.sets.get(epfd)!) if (this.open.has(fd) && !this.alive(this.open.get(fd)!)) out.push(data);
    return out;
  }
  close(fd: number): void {
    this.open.delete(fd);
    this.sets.delete(fd);
  }
  listTasks(): ReadonlySet<number> {
    return new Set(this.threads.filter((t) => this.alive(t.tid)).map((t) => t.tid));
  }
  aliveAt(at: number): Thread[] {
    return this.threads.filter((t) => t.born <= at && at < t.died);
  }
}

/** A share that grants at most `room` fds in all, and checks none is given back twice. */
function ledgerOf(room: number): KeptFdLedger & { held: number } {
  const l = {
    held: 0,
    grant(_pid: number, n: number) {
      const got = Math.min(n, room - l.held);
      l.held += got;
      return got;
    },
    release(_pid: number, n: number) {
      l.held -= n;
      if (l.held < 0) throw new Error('more fds given back than granted');
    },
  };
  return l;
}

const windowArb = fc.record({
  /** Threads alive since long before the window (ticks at QEMU's read). */
  old: fc.array(fc.option(fc.integer({ min: 1, max: SPAN }), { nil: Infinity }), { minLength: 1, maxLength: 6 }),
  /** Their run time before the window: none (QEMU reads 0 ticks of them), or some. */
  oldRan: fc.constantFrom(0, 2_000, 5 * TICK),
  /** Threads started in the window: [born, lifetime]. */
  young: fc.array(
    fc.tuple(
      fc.integer({ min: 1, max: SPAN }),
      fc.option(fc.integer({ min: 0, max: SPAN }), { nil: Infinity }),
      fc.constantFrom(0, 0.01, 0.3, 1),
    ),
    { maxLength: 5 },
  ),
  /** The share of a CPU the old threads run. */
  oldRate: fc.constantFrom(0, 0.05, 1),
  /** Whether the helper knows the CPU time of the threads between its reads (the process clock). */
  cpuKnown: fc.boolean(),
  /** The share of a CPU QEMU's main thread runs (its QMP monitor; never listed), and whether its run time was read. */
  mainRate: fc.constantFrom(0, 0.5, 1),
  mainRead: fc.boolean(),
  /** QEMU's listing, then its start request a little later. */
  listAt: fc.integer({ min: 1, max: SPAN / 2 }),
  request: fc.integer({ min: 0, max: 200 }),
  /** The helper's start read after the start reply, this long after the request. */
  readAfter: fc.integer({ min: 0, max: 3_000 }),
  /** Whether the settling's read (the last read) may stand for the start read. */
  settled: fc.boolean(),
  /** The end's reply, this long after the start read. */
  replyAfter: fc.integer({ min: 0, max: SPAN }),
  probe: fc.constantFrom<ExitProbeKind>('pidfd', 'tasks'),
  room: fc.integer({ min: 0, max: 16 }),
  forecast: fc.boolean(),
});

describe('thread exits known by identity', () => {
  it('a window in which a thread QEMU listed, with ticks, exited before the reply is never answered a non-zero delta', () => {
    fc.assert(
      fc.property(windowArb, (w) => {
        const threads: Thread[] = [
          ...w.old.map((died, i) => ({ tid: 1000 + i, born: 0, died, rate: w.oldRate, ran0: w.oldRan })),
          ...w.young.map(([born, life, rate], i) => ({ tid: 2000 + i, born, died: born + life, rate, ran0: 0 })),
        ];
        // The CPU time of every thread between two instants (the process's clock; no vCPU here).
        const cpu = (from: number, to: number) =>
          threads.reduce((sum, t) => sum + t.rate * Math.max(0, Math.min(t.died, to) - Math.max(t.born, from)), 0);
        const os = new SimOs(threads);
        const ledger = ledgerOf(w.room);
        const watch = new ExitWatch(PID, w.probe, { os, tickNs: TICK, ledger });
        const before = new Set(os.aliveAt(0).map((t) => t.tid));
        const listed = os.aliveAt(w.listAt);
        const requestAt = w.listAt + w.request;
        // GuestEnergy.startFromSettled: the settling's read stands when the count is as it found.
        const settled = w.settled && os.aliveAt(requestAt).length === before.size;
        const startAt = settled ? requestAt : requestAt + w.readAfter;
        const readAt = settled ? 0 : startAt;
        const startThreads = os.aliveAt(readAt);
        const start = startThreads.map((t) => t.tid);
        os.now = startAt;
        const gapNs = settled ? requestAt : startAt;
        // The helper's start read (a settling's read stands `gapNs` before the start; a thread at full rate reads R).
        const read = {
          threads: new Map(startThreads.map((t) => [t.tid, { tid: t.tid, ticks: ticksAt(t, readAt), starttime: 1, pkg: 0 }])),
          runTimes: new Map(startThreads.map((t) => [t.tid, t.rate === 1 ? null : String(runTime(t, readAt))])),
        };
        const idle = idleAtList(read, settled ? gapNs : 0, TICK);
        // The process clock counts the main thread too; its run time, when read, comes off (unseenCpuNs).
        const main = w.mainRead ? [w.mainRate * gapNs, 0] : [null, null];
        const cpuNs = unseenCpuNs(cpu(0, gapNs) + w.mainRate * gapNs, 0, main[0]!, main[1]);
        watch.begin({ tids: start, before, gapNs, ...(w.cpuKnown ? { cpuNs } : {}), idle });
        const replyAt = startAt + w.replyAfter;
        os.now = replyAt;
        const exit = watch.exited();
        // QEMU read ticks of a thread (it had run a tick by its listing) that exited before the reply.
        const harmful = listed.some((t) => ticksAt(t, w.listAt) > 0 && t.died <= replyAt);
        if (harmful) expect(exit).toBe(true);
        // And it is not a verdict of every window: the reads less than a tick apart, and every thread gone by the
        // reply one the start read saw that QEMU read at 0 ticks: no exit.
        const quiet = gapNs < TICK && threads.every((t) => t.died > replyAt || (start.includes(t.tid) && idle.has(t.tid)));
        if (quiet) expect(exit).toBe(false);
        for (const tid of idle)
          expect(
            ticksAt(
              threads.find((t) => t.tid === tid)!,
              w.listAt,
            ),
            'idle: QEMU read 0 ticks',
          ).toBe(0);
        // The model's answer with that verdict: a zero delta on every package.
        const c = freshGuestCounter(1, PID, 1, 1, 0);
        c.phases.pkgs = [0];
        c.start = new Map<number, ThreadRead>(start.map((tid) => [tid, { tid, ticks: 5, starttime: 1, pkg: 0 }]));
        c.owedUnits = 1e6;
        const vcpu = start[0];
        const vm = { pid: PID, vcpus: new Map(vcpu === undefined ? [] : [[vcpu, 0]]), nvpkg: 1 };
        const at0 = c.counters.get(0) ?? 0;
        if (w.forecast) {
          const vcpus = vcpu === undefined ? [] : [{ pkg: 0, ticks0: 5, ticks1: 50 }];
          answerForecast(c, { pkg: 0, vcpus, otherTicks: 3, exactJ: 1, unitJ: 1e-6, maxTicks: MAX_TICKS, zero: exit });
        } else {
          const end = new Map([...c.start].map(([tid, r]) => [tid, { ...r, ticks: 50 }]));
          closeWindow(c, vm, { pkg: 0, end, exactJ: 1, unitJ: 1e-6, maxTicks: MAX_TICKS, zero: exit });
        }
        if (harmful) expect(c.counters.get(0) ?? 0).toBe(at0);
        watch.close();
        expect(ledger.held, 'every fd granted given back').toBe(0);
        expect([...os.open.keys()], 'every fd closed').toEqual([]);
      }),
      {
        numRuns: 3000,
        // A thread that ran 15 ms, listed by QEMU, gone before the start read 200 µs later: the CPU clock tells.
        examples: [
          [
            {
              old: [Infinity],
              young: [[1, 15_100, 1]],
              listAt: 15_000,
              request: 100,
              readAfter: 100,
              settled: false,
              replyAfter: 1000,
              probe: 'pidfd',
              room: 16,
              forecast: true,
              oldRate: 0,
              oldRan: 0,
              cpuKnown: true,
              mainRate: 1,
              mainRead: true,
            },
          ],
        ],
      },
    );
  });
});
