/**
 * The one tick loop (sampling/tick-loop.ts), driven by an injected
 * clock and injected timers: each timer fires exactly when the test says, as late as the test says,
 * so lateness, skipping and drift are checked without waiting and without a flaky machine.
 */
import { describe, expect, test } from 'vitest';
import { TickLoop, type TickInfo } from '../../src/sampling/tick-loop.js';
import { ManualTime } from '../support/manual-time.js';

const MS = 1_000_000n;
const INTERVAL = 1000n * MS;

function loopWith(time: ManualTime, tick: (t: TickInfo) => void = () => {}, onError?: (e: unknown) => void, intervalNs = INTERVAL) {
  const ticks: TickInfo[] = [];
  const loop = new TickLoop({
    intervalNs,
    clock: time.clock,
    timers: time,
    tick: (t) => {
      ticks.push(t);
      tick(t);
    },
    ...(onError ? { onError } : {}),
  });
  return { loop, ticks };
}

describe('TickLoop with an injected clock and timers', () => {
  test('does not drift: 10 000 ticks each fired 30 % of an interval late stay on origin + k x interval', () => {
    const time = new ManualTime();
    const { loop, ticks } = loopWith(time);
    const origin = time.now;
    loop.start();
    for (let i = 0; i < 10_000; i++) time.fire((INTERVAL * 3n) / 10n);
    expect(ticks).toHaveLength(10_000);
    expect(ticks.every((t, i) => t.k === BigInt(i + 1) && t.idealNs === origin + BigInt(i + 1) * INTERVAL)).toBe(true);
    expect(ticks.every((t) => t.latenessNs === (INTERVAL * 3n) / 10n && t.skipped === 0)).toBe(true);
    // The next is due at its ideal time, not 10 000 x 0.3 intervals later.
    expect(time.nextAt).toBe(origin + 10_001n * INTERVAL);
    loop.stop();
  });

  test('a late tick does not push the next one back', () => {
    const time = new ManualTime();
    const { loop, ticks } = loopWith(time);
    const origin = time.now;
    loop.start();
    time.fire(600n * MS); // tick 1, 0.6 s late
    expect(ticks[0]).toMatchObject({ k: 1n, latenessNs: 600n * MS, skipped: 0 });
    expect(time.nextAt).toBe(origin + 2n * INTERVAL); // 0.4 s after the late tick, not 1 s
    time.fire();
    expect(ticks[1]).toMatchObject({ k: 2n, latenessNs: 0n, skipped: 0 });
    loop.stop();
  });

  test('ticks missed while the loop was stalled are skipped, not run in a burst', () => {
    const time = new ManualTime();
    let stall = 0n;
    const { loop, ticks } = loopWith(time, () => {
      time.now += stall; // the tick itself takes this long (a slow sample)
      stall = 0n;
    });
    const origin = time.now;
    loop.start();
    time.fire();
    stall = 3500n * MS; // tick 2 takes 3.5 s: ticks 3, 4 and 5 pass meanwhile
    time.fire();
    expect(time.pending).toBe(1); // one timer, not a backlog
    expect(time.nextAt).toBe(origin + 6n * INTERVAL);
    time.fire();
    expect(ticks.map((t) => [t.k, t.skipped])).toEqual([
      [1n, 0],
      [2n, 0],
      [6n, 3],
    ]);
    loop.stop();
  });

  test('a tick fired exactly one interval late skips the tick due at that moment (no tick scheduled for now)', () => {
    const time = new ManualTime();
    const { loop, ticks } = loopWith(time);
    const origin = time.now;
    loop.start();
    time.fire(INTERVAL); // tick 1 fires when tick 2 is due
    expect(time.nextAt).toBe(origin + 3n * INTERVAL);
    time.fire();
    expect(ticks.map((t) => [t.k, t.skipped])).toEqual([
      [1n, 0],
      [3n, 1],
    ]);
    loop.stop();
  });

  test('refuses a zero interval instead of looping', () => {
    expect(() => loopWith(new ManualTime(), undefined, undefined, 0n)).toThrow(/must be positive/);
  });

  test('immediate start fires tick 0 at the origin, then one per interval', () => {
    const time = new ManualTime();
    const { loop, ticks } = loopWith(time);
    const origin = time.now;
    loop.start({ immediate: true });
    expect(time.nextAt).toBe(origin);
    time.fire();
    time.fire();
    expect(ticks.map((t) => [t.k, t.idealNs - origin])).toEqual([
      [0n, 0n],
      [1n, INTERVAL],
    ]);
    loop.stop();
  });

  test('with an end time, ticks up to it, then stops at it and calls onEnd once', () => {
    const time = new ManualTime();
    const { loop, ticks } = loopWith(time);
    const origin = time.now;
    let ended = 0;
    loop.start({ endNs: origin + 2500n * MS, onEnd: () => ended++ });
    time.fire();
    time.fire();
    expect(time.nextAt).toBe(origin + 2500n * MS);
    time.fire();
    expect(ticks.map((t) => t.k)).toEqual([1n, 2n]);
    expect(ended).toBe(1);
    expect(loop.running).toBe(false);
    expect(time.pending).toBe(0);
  });

  test('a tick that throws stops the loop and reaches onError; stop() inside a tick leaves nothing pending', () => {
    const time = new ManualTime();
    const errors: unknown[] = [];
    const { loop } = loopWith(
      time,
      (t) => {
        if (t.k === 2n) throw new Error('energy source gone');
      },
      (e) => errors.push(e),
    );
    loop.start();
    time.fire();
    time.fire();
    expect((errors[0] as Error).message).toBe('energy source gone');
    expect(loop.running).toBe(false);
    expect(time.pending).toBe(0);

    const t2 = new ManualTime();
    const second = loopWith(t2, () => second.loop.stop());
    second.loop.start();
    t2.fire();
    expect(second.ticks).toHaveLength(1);
    expect(t2.pending).toBe(0);
  });
});
