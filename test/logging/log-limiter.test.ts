import { Writable } from 'node:stream';
import { pino } from 'pino';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { DEFAULT_LOG_WINDOW_MS, LogLimiter } from '../../src/logging/log-limiter.js';

function logger() {
  const lines: { msg: string; cause?: string; suppressed?: number }[] = [];
  const out = new Writable({
    write(c: Buffer, _e, cb) {
      lines.push(JSON.parse(c.toString()));
      cb();
    },
  });
  return { log: pino({ level: 'info' }, out), lines };
}

afterEach(() => {
  vi.useRealTimers();
});

describe('LogLimiter', () => {
  it('logs a burst per cause, counts the rest, and says how many were suppressed when the window ends', async () => {
    vi.useFakeTimers();
    const { log, lines } = logger();
    const l = new LogLimiter(log, 3);
    for (let i = 0; i < 100; i++) l.warn('a', { i }, 'cause a');
    for (let i = 0; i < 2; i++) l.warn('b', {}, 'cause b');
    expect(lines.filter((x) => x.cause === 'a')).toHaveLength(3);
    expect(lines.filter((x) => x.cause === 'b')).toHaveLength(2);
    expect(lines).toHaveLength(5); // the 97 are counted, said when the window ends
    await vi.advanceTimersByTimeAsync(DEFAULT_LOG_WINDOW_MS);
    expect(lines.at(-1)).toMatchObject({ cause: 'a', suppressed: 97, msg: "97 more 'a' messages suppressed in the last 60 s" });
    // a new window logs again
    l.warn('a', {}, 'cause a');
    expect(lines.at(-1)!.msg).toBe('cause a');
  });

  it('flush() writes pending counts at once (shutdown), and nothing when none was suppressed', () => {
    const { log, lines } = logger();
    const l = new LogLimiter(log, 1);
    l.warn('x', {}, 'x');
    l.warn('x', {}, 'x');
    l.warn('y', {}, 'y');
    const before = lines.length;
    l.flush();
    expect(lines.slice(before).map((x) => x.msg)).toEqual(["1 more 'x' messages suppressed in the last 1 s"]);
  });
});
