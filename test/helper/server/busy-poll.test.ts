/**
 * The busy poll's policy without the world: its window (QEMU's adjust_polling_time) over every kind of wait, and the poll
 * on a clock and a loop the test drives (what is ready, what a connection has in). The real loop: test/os/event-loop-fd.test.ts; the daemon
 * polling beside other clients: test/hostile/busy-poll-starves-no-client.test.ts.
 */
import { describe, expect, test } from 'vitest';
import { BusyPoll, nextWindow, type BusyPollIo, type DirectReader } from '../../../src/helper/server/busy-poll.js';
import { DEFAULT_BUSY_POLL_MAX_US } from '../../../src/helper/server/listener.js';

const MAX = DEFAULT_BUSY_POLL_MAX_US;

describe('nextWindow', () => {
  test('a window grows from 0 to 4 µs, then doubles up to the maximum, when each wait ended within the maximum but past the window', () => {
    const seen: number[] = [];
    for (let w = 0, i = 0; i < 10; i++) seen.push((w = nextWindow(w, MAX, MAX)));
    expect(seen).toEqual([4, 8, 16, 32, 32, 32, 32, 32, 32, 32]);
    for (const max of [1, 5, 7, 100, 1000])
      expect(nextWindow(nextWindow(nextWindow(0, max, max), max, max), max, max)).toBeLessThanOrEqual(max);
  });

  test('a window stays when the wait ended within it, at every window and wait', () => {
    for (const w of [4, 8, 16, 32]) for (const waited of [0, 0.5, w / 2, w]) expect(nextWindow(w, waited, MAX)).toBe(w);
  });

  test('a window drops to 0 after a wait longer than the maximum, from any window', () => {
    for (const w of [0, 4, 8, 16, 32]) for (const waited of [MAX + 0.001, 100, 1e6, Infinity]) expect(nextWindow(w, waited, MAX)).toBe(0);
  });
});

const FD = 7;
const OTHER_FD = 9;

/**
 * A loop the test drives, with one connection: each clock read advances `stepUs`; the connection is ready once its next
 * request has come (`gapUs` after its last reply; read at once by the poll or, after the turn, by the loop), another fd once
 * `otherAt` has passed.
 */
function drivenLoop(o: { stepUs: number; gapUs: number; cannotTell?: boolean; otherAt?: number }) {
  let t = 0;
  let arrival = Infinity;
  const turnEnds: (() => void)[] = [];
  const seen = { checks: 0, direct: 0, lateUs: 0 };
  const io: BusyPollIo = {
    ready: () => {
      if (o.cannotTell) return undefined;
      seen.checks++;
      const [mine, theirs] = [t >= arrival, t >= (o.otherAt ?? Infinity)];
      return mine && theirs ? 'several' : mine ? FD : theirs ? OTHER_FD : 'nothing';
    },
    nowUs: () => (t += o.stepUs),
    atTurnEnd: (run) => void turnEnds.push(run),
  };
  let poll: BusyPoll;
  /** The connection's request read (by the poll or the loop), answered: its next comes `gapUs` later. */
  const answer = () => {
    seen.lateUs = Math.max(seen.lateUs, t - arrival);
    poll.arrived();
    arrival = t + o.gapUs;
    poll.replied(connection);
  };
  const connection: DirectReader = {
    fd: () => FD,
    readNow: () => {
      if (t < arrival) return false;
      seen.direct++;
      answer();
      return true;
    },
  };
  const endTurn = () => turnEnds.splice(0).map((run) => run()).length;
  return {
    io,
    connection,
    seen,
    endTurn,
    start(p: BusyPoll) {
      poll = p;
      arrival = t + o.gapUs;
      poll.replied(connection);
    },
    /** A loop turn: the poll at its end, then (when the poll left it) the loop waiting for and reading the next request. */
    turn() {
      endTurn();
      if (arrival === Infinity) return;
      t = Math.max(t, arrival);
      answer();
    },
    /** The poll of a turn whose client never asks again: the time it took. */
    quietTurn(): number {
      arrival = Infinity;
      const before = t;
      endTurn();
      return t - before;
    },
  };
}

function warmLoop(o: Parameters<typeof drivenLoop>[0], maxUs?: number) {
  const loop = drivenLoop(o);
  const poll = new BusyPoll(loop.io, maxUs);
  loop.start(poll);
  return { loop, poll };
}

describe('BusyPoll', () => {
  test('one poll a turn for one connection answered many times; none for a turn that answered several (the next turn has work)', () => {
    const { loop, poll } = warmLoop({ stepUs: 1, gapUs: 5 });
    for (let i = 0; i < 100; i++) poll.replied(loop.connection);
    expect(loop.endTurn()).toBe(1);
    poll.replied(loop.connection);
    poll.replied({ fd: () => OTHER_FD, readNow: () => true });
    expect(loop.endTurn()).toBe(1);
    expect(loop.seen.checks, 'a turn of two connections: the poll looked at nothing').toBe(0);
  });

  test('a client asking again within the maximum has its requests read by the poll as they come, after a few turns', () => {
    for (const gapUs of [1, 3, 10, 20, MAX - 1]) {
      const { loop, poll } = warmLoop({ stepUs: 0.5, gapUs });
      for (let turn = 0; turn < 6; turn++) loop.turn();
      const direct = loop.seen.direct;
      loop.seen.lateUs = 0;
      for (let turn = 0; turn < 5; turn++) loop.turn();
      expect(loop.seen.direct - direct, `gaps of ${gapUs} µs: requests read by the poll`).toBeGreaterThan(5);
      expect(loop.seen.lateUs, `gaps of ${gapUs} µs: each read as it came`).toBeLessThanOrEqual(0.5);
      expect(poll.window).toBeGreaterThanOrEqual(gapUs);
    }
  });

  test('requests read by the poll stop after a millisecond, even from a client whose next request is always in', () => {
    for (const stepUs of [0.1, 1, 5]) {
      const { loop } = warmLoop({ stepUs, gapUs: 0 });
      for (let turn = 0; turn < 6; turn++) loop.turn();
      const [before, start] = [loop.seen.direct, loop.io.nowUs()];
      loop.endTurn();
      const took = loop.io.nowUs() - start;
      expect(loop.seen.direct - before, `clock steps of ${stepUs} µs: the turn read some`).toBeGreaterThan(0);
      expect(took, `clock steps of ${stepUs} µs: the turn ended`).toBeLessThanOrEqual(1000 + 10 * stepUs);
    }
  });

  test('a client asking at QEMU’s pace (a wait past the maximum each time) is never polled for', () => {
    for (const gapUs of [MAX + 1, 1000, 1e6]) {
      const { loop, poll } = warmLoop({ stepUs: 1, gapUs });
      for (let turn = 0; turn < 50; turn++) loop.turn();
      expect(loop.seen.checks, `gaps of ${gapUs} µs`).toBe(0);
      expect(poll.window).toBe(0);
    }
  });

  test('another fd ready ends the poll at once, the connection left to the loop, whether its next request is in or not', () => {
    for (const gapUs of [0, 2, 10]) {
      const { loop, poll } = warmLoop({ stepUs: 1, gapUs, otherAt: 0 });
      for (let turn = 0; turn < 10; turn++) loop.turn();
      expect(poll.window, `gaps of ${gapUs} µs: the poll opened`).toBeGreaterThan(0);
      expect(loop.seen.checks, `gaps of ${gapUs} µs: the poll looked`).toBeGreaterThan(0);
      expect(loop.seen.direct, `gaps of ${gapUs} µs: requests read by the poll`).toBe(0);
      expect(loop.seen.checks, `gaps of ${gapUs} µs: one look a turn`).toBeLessThanOrEqual(10);
    }
  });

  test('a poll never lasts longer than its window, however long the loop stays quiet, and a long quiet stops the polling', () => {
    for (const stepUs of [0.1, 1, 3]) {
      const { loop, poll } = warmLoop({ stepUs, gapUs: 2 });
      for (let turn = 0; turn < 8; turn++) loop.turn();
      const window = poll.window;
      expect(window).toBeGreaterThan(0);
      expect(loop.quietTurn(), `clock steps of ${stepUs} µs`).toBeLessThanOrEqual(window + 2 * stepUs);
    }
  });

  test('a process that cannot tell its loop’s readiness never polls, and a maximum of 0 never schedules a poll', () => {
    const { loop, poll } = warmLoop({ stepUs: 1, gapUs: 5, cannotTell: true });
    for (let turn = 0; turn < 20; turn++) loop.turn();
    expect(poll.window).toBe(0);
    expect(loop.seen.direct).toBe(0);
    const off = warmLoop({ stepUs: 1, gapUs: 5 }, 0);
    expect(off.loop.endTurn()).toBe(0);
  });
});
