/**
 * THE rate limiter for log lines a client (or a resource shortage) can trigger at will. Per cause, at
 * most `burst` lines per window; the rest are counted in one "N more ... suppressed" line when the
 * window ends (or at flush()). Causes are names chosen by the code, never by a client: the state is bounded.
 */
import type { Logger } from 'pino';

interface LogLimiterOptions {
  /** Lines logged per cause per window before suppression (default 5). */
  burst?: number;
  /** Window length in ms (default 60 s). */
  windowMs?: number;
  now?: () => number;
}

type Level = 'warn' | 'info' | 'error';

interface CauseState {
  level: Level;
  windowStart: number;
  emitted: number;
  suppressed: number;
  timer: NodeJS.Timeout | undefined;
}

const DEFAULT_LOG_BURST = 5;
export const DEFAULT_LOG_WINDOW_MS = 60_000;

export class LogLimiter {
  private readonly states = new Map<string, CauseState>();
  private readonly burst: number;
  private readonly windowMs: number;
  private readonly now: () => number;

  constructor(
    private readonly log: Logger,
    o: LogLimiterOptions = {},
  ) {
    this.burst = o.burst ?? DEFAULT_LOG_BURST;
    this.windowMs = o.windowMs ?? DEFAULT_LOG_WINDOW_MS;
    this.now = o.now ?? Date.now;
  }

  warn(cause: string, obj: object, msg: string): void {
    this.write('warn', cause, obj, msg);
  }

  info(cause: string, obj: object, msg: string): void {
    this.write('info', cause, obj, msg);
  }

  error(cause: string, obj: object, msg: string): void {
    this.write('error', cause, obj, msg);
  }

  /** Lines suppressed so far in the current window of `cause`. */
  suppressed(cause: string): number {
    return this.states.get(cause)?.suppressed ?? 0;
  }

  /** Writes every pending "N more suppressed" line now (shutdown); windows start afresh. */
  flush(): void {
    for (const cause of [...this.states.keys()]) this.close(cause);
  }

  private write(level: Level, cause: string, obj: object, msg: string): void {
    const t = this.now();
    let s = this.states.get(cause);
    if (s !== undefined && t - s.windowStart >= this.windowMs) {
      this.close(cause);
      s = undefined;
    }
    if (s === undefined) {
      s = { level, windowStart: t, emitted: 0, suppressed: 0, timer: undefined };
      this.states.set(cause, s);
    }
    if (s.emitted < this.burst) {
      s.emitted++;
      this.log[level](
        { ...obj, cause },
        s.emitted === this.burst ? `${msg} (further '${cause}' messages are counted for ${this.windowMs / 1000} s)` : msg,
      );
      return;
    }
    s.suppressed++;
    if (s.timer === undefined) {
      s.timer = setTimeout(() => this.close(cause), Math.max(0, s.windowStart + this.windowMs - t));
      s.timer.unref();
    }
  }

  private close(cause: string): void {
    const s = this.states.get(cause);
    if (s === undefined) return;
    if (s.timer !== undefined) clearTimeout(s.timer);
    this.states.delete(cause);
    if (s.suppressed > 0) {
      const seconds = Math.max(1, Math.round((this.now() - s.windowStart) / 1000));
      this.log[s.level](
        { cause, suppressed: s.suppressed },
        `${s.suppressed} more '${cause}' messages suppressed in the last ${seconds} s`,
      );
    }
  }
}
