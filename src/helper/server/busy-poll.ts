/**
 * Busy polling after replies, as QEMU's own event loop polls (its AioContext's poll-max-ns; docs/daemon.md "Busy polling").
 * A client that asks again within microseconds of a reply (one request at a time, in a tight loop) is answered without the
 * sleep and wake-up each round trip costs otherwise: at the end of a loop turn that sent replies, the loop's readiness is
 * polled for up to a window. The poll ends at ANY event of the loop (any connection, a signal, a timer's neighbour fd), so no
 * connection waits for another's polling. The window adapts as QEMU's does: it grows from 4 µs, doubling up to the maximum,
 * while each wait for the next request ended within the maximum, and drops to 0 after a longer one: a helper asked at
 * QEMU's pace (a few requests per vCPU and interval) never polls, and polling costs at most the window per loop turn.
 */

/** The window's maximum by default (µs): QEMU's default poll-max-ns for its I/O threads, 32768 ns. */
export const DEFAULT_BUSY_POLL_MAX_US = 32;
/** The longest --busy-poll-max-us: a millisecond, past any round trip a poll could save. */
export const MAX_BUSY_POLL_US = 1000;
/** The first window after a short wait (µs), as QEMU's. */
const FIRST_WINDOW_US = 4;

/** The window after a wait of `waitedUs` (QEMU's adjust_polling_time, growing by 2, shrinking to 0). */
export function nextWindow(windowUs: number, waitedUs: number, maxUs: number): number {
  if (waitedUs <= windowUs) return windowUs;
  if (waitedUs > maxUs) return 0;
  return Math.min(maxUs, windowUs === 0 ? FIRST_WINDOW_US : windowUs * 2);
}

/** What the poll needs of the world: whether the loop has an event ready, the time (µs), and a call at the end of the turn. */
export interface BusyPollIo {
  /** Whether any event of the loop is ready; undefined when this process cannot tell: then it never polls. */
  ready(): boolean | undefined;
  nowUs(): number;
  atTurnEnd(run: () => void): void;
}

export class BusyPoll {
  private windowUs = 0;
  private scheduled = false;
  /** When the last poll gave up (µs): the next request's arrival measures the rest of that wait. */
  private waitingSince: number | undefined;
  private readonly pollNow = () => this.poll();

  constructor(
    private readonly io: BusyPollIo,
    private maxUs = DEFAULT_BUSY_POLL_MAX_US,
  ) {}

  get window(): number {
    return this.windowUs;
  }

  /** A request arrived: a wait the poll gave up on ends here. */
  arrived(): void {
    if (this.waitingSince === undefined) return;
    this.windowUs = nextWindow(this.windowUs, this.io.nowUs() - this.waitingSince, this.maxUs);
    this.waitingSince = undefined;
  }

  /** Replies were sent: poll once this loop turn has served everything it had. */
  replied(): void {
    if (this.scheduled || this.maxUs === 0) return;
    this.scheduled = true;
    this.io.atTurnEnd(this.pollNow);
  }

  private poll(): void {
    this.scheduled = false;
    const start = this.io.nowUs();
    for (let now = start; now - start < this.windowUs; now = this.io.nowUs()) {
      const ready = this.io.ready();
      if (ready === undefined) this.maxUs = this.windowUs = 0;
      else if (ready) return void (this.windowUs = nextWindow(this.windowUs, now - start, this.maxUs));
    }
    this.waitingSince = start;
  }
}
