/**
 * Busy polling after replies, as QEMU's own event loop polls (its AioContext's poll-max-ns; docs/daemon.md "Busy polling").
 * A client that asks again within microseconds of a reply (one request at a time, in a tight loop) is answered without the
 * sleep, the wake-up and the event loop's turn each round trip costs otherwise: at the end of a loop turn that answered one
 * connection, the loop's readiness is polled for up to a window, and when that connection alone has its next request in,
 * it is read and answered at once. Anything else ready (another connection, a signal, a worker's completion) ends the poll,
 * so no connection waits for another's; a turn that answered several connections does not poll (the next turn has work).
 * The window adapts as QEMU's does: it grows from 4 µs, doubling up to the maximum, while each wait for the next request
 * ended within the maximum, and drops to 0 after a longer one: a helper asked at QEMU's pace (a few requests per vCPU and
 * interval) never polls. The poll waits at most the window for each request it reads, and once more before it gives up.
 */

import { DEFAULT_BUSY_POLL_MAX_US } from './listener.js';

/** The first window after a short wait (µs), as QEMU's. */
const FIRST_WINDOW_US = 4;
/** Requests read at once in one turn, at most for this long (µs): timers (the sampling) and other work wait no longer. */
const MAX_DIRECT_READS_US = 1000;

/** The window after a wait of `waitedUs` (QEMU's adjust_polling_time, growing by 2, shrinking to 0). */
export function nextWindow(windowUs: number, waitedUs: number, maxUs: number): number {
  if (waitedUs <= windowUs) return windowUs;
  if (waitedUs > maxUs) return 0;
  return Math.min(maxUs, windowUs === 0 ? FIRST_WINDOW_US : windowUs * 2);
}

/** What the poll needs of the world: what the loop has ready, the time (µs), and a call at the end of the turn. */
export interface BusyPollIo {
  /** What the loop has ready: nothing, several fds, or the one ready fd; undefined when this process cannot tell: then it never polls. */
  ready(): number | 'nothing' | 'several' | undefined;
  nowUs(): number;
  atTurnEnd(run: () => void): void;
}

/** A connection answered this turn: its fd, and a read of its next requests now (false: nothing read, left to the loop). */
export interface DirectReader {
  fd(): number | undefined;
  readNow(): boolean;
}

export class BusyPoll {
  private windowUs = 0;
  /** The connection answered this turn, until the poll at its end; null: several were. */
  private answered: DirectReader | null | undefined;
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

  /** `connection`'s replies were sent: poll once this loop turn has served everything it had. */
  replied(connection: DirectReader): void {
    if (this.maxUs === 0) return;
    if (this.answered === undefined) this.io.atTurnEnd(this.pollNow);
    else if (this.answered !== connection) return void (this.answered = null);
    this.answered = connection;
  }

  private poll(): void {
    const answered = this.answered;
    try {
      if (answered) this.spin(answered);
    } finally {
      this.answered = undefined;
    }
  }

  /** Polls up to the window, reading `connection` at once each time it alone is ready, for MAX_DIRECT_READS_US at most. */
  private spin(connection: DirectReader): void {
    const first = this.io.nowUs();
    let start = first;
    for (let now = start; now - start < this.windowUs; now = this.io.nowUs()) {
      const ready = this.io.ready();
      if (ready === undefined) return void (this.maxUs = this.windowUs = 0);
      if (ready === 'nothing') continue;
      this.windowUs = nextWindow(this.windowUs, now - start, this.maxUs);
      if (ready !== connection.fd() || now - first > MAX_DIRECT_READS_US || !connection.readNow()) return;
      start = this.io.nowUs();
    }
    this.waitingSince = start;
  }
}
