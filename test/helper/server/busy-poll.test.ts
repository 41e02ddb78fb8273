/**
 * The busy poll's policy without the world: its window (QEMU's adjust_polling_time) over every kind of wait, and the poll
 * on a clock and a loop readiness the test drives. The real loop's readiness: test/os/event-loop-fd.test.ts; the daemon
 * polling beside other clients: test/hostile/busy-poll-starves-no-client.test.ts.
 */
import { describe, expect, test } from 'vitest';
import { BusyPoll, DEFAULT_BUSY_POLL_MAX_US, nextWindow, type BusyPollIo } from '../../../src/helper/server/busy-poll.js';

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

/** A loop the test drives: each clock read advances `stepUs`; ready once the client's next request has come. */
function drivenLoop(o: { stepUs: number; cannotTell?: boolean }) {
  let t = 0;
  let checks = 0;
  let arrival = Infinity;
  const turnEnds: (() => void)[] = [];
  const io: BusyPollIo = {
    ready: () => (o.cannotTell ? undefined : (checks++, t >= arrival)),
    nowUs: () => (t += o.stepUs),
    atTurnEnd: (run) => void turnEnds.push(run),
  };
  const endTurn = () => turnEnds.splice(0).map((run) => run()).length;
  return {
    io,
    endTurn,
    /** One round trip: replies sent, the turn's end (the poll), the next request `gapUs` after the replies, read. Returns the checks. */
    round(poll: BusyPoll, gapUs: number): { checks: number; readLateUs: number } {
      arrival = t + gapUs;
      checks = 0;
      poll.replied();
      endTurn();
      const readLateUs = Math.max(0, t - arrival);
      t = Math.max(t, arrival);
      poll.arrived();
      arrival = Infinity;
      return { checks, readLateUs };
    },
    /** Replies sent and nobody asks again: the time the poll took. */
    quiet(poll: BusyPoll): number {
      const start = t;
      poll.replied();
      endTurn();
      return t - start;
    },
  };
}

describe('BusyPoll', () => {
  test('replies of many connections in one turn make one poll, at the turn end', () => {
    const loop = drivenLoop({ stepUs: 1 });
    const poll = new BusyPoll(loop.io);
    for (let i = 0; i < 100; i++) poll.replied();
    expect(loop.endTurn()).toBe(1);
    poll.replied();
    expect(loop.endTurn()).toBe(1);
  });

  test('a client that asks again within the maximum is polled for after a few round trips, and its request read as it comes', () => {
    for (const gapUs of [1, 3, 10, 20, MAX - 1]) {
      const loop = drivenLoop({ stepUs: 0.5 });
      const poll = new BusyPoll(loop.io);
      for (let round = 0; round < 5; round++) loop.round(poll, gapUs);
      for (let round = 0; round < 20; round++) {
        const { checks, readLateUs } = loop.round(poll, gapUs);
        expect(checks, `gaps of ${gapUs} µs: the poll ran`).toBeGreaterThan(0);
        expect(readLateUs, `gaps of ${gapUs} µs: the poll ended at the request`).toBeLessThanOrEqual(0.5);
      }
      expect(poll.window).toBeGreaterThanOrEqual(gapUs);
    }
  });

  test('a client asking at QEMU’s pace (a wait past the maximum each time) is never polled for', () => {
    for (const gapUs of [MAX + 1, 1000, 1e6]) {
      const loop = drivenLoop({ stepUs: 1 });
      const poll = new BusyPoll(loop.io);
      for (let round = 0; round < 50; round++) expect(loop.round(poll, gapUs).checks, `gaps of ${gapUs} µs`).toBe(0);
      expect(poll.window).toBe(0);
    }
  });

  test('a poll never lasts longer than its window, however long the loop stays quiet, and a long quiet stops the polling', () => {
    for (const stepUs of [0.1, 1, 3]) {
      const loop = drivenLoop({ stepUs });
      const poll = new BusyPoll(loop.io);
      for (let round = 0; round < 8; round++) loop.round(poll, 2);
      expect(poll.window).toBeGreaterThan(0);
      expect(loop.quiet(poll), `clock steps of ${stepUs} µs`).toBeLessThanOrEqual(poll.window + 2 * stepUs);
      loop.round(poll, 1e6); // polled for (the window was open), then read 1 s later: too long a wait
      expect(poll.window).toBe(0);
      expect(loop.round(poll, 1e6).checks).toBe(0);
    }
  });

  test('a process that cannot tell its loop’s readiness never polls, and a maximum of 0 never schedules a poll', () => {
    const blind = drivenLoop({ stepUs: 1, cannotTell: true });
    const poll = new BusyPoll(blind.io);
    for (let round = 0; round < 20; round++) blind.round(poll, 5);
    expect(poll.window).toBe(0);
    expect(blind.round(poll, 5).checks).toBe(0);
    const off = drivenLoop({ stepUs: 1 });
    const never = new BusyPoll(off.io, 0);
    never.replied();
    expect(off.endTurn()).toBe(0);
  });
});
