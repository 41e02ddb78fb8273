/**
 * THE rate limiter for log lines a client (or a resource shortage) can trigger at will. Per cause, at
 * most `burst` lines per window; the rest are counted in one "N more ... suppressed" line when the
 * window ends (or at flush()). Causes are names chosen by the code, never by a client: the state is bounded.
 */
import type { Logger } from 'pino';

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

  constructor(
    private readonly log: Logger,
    /** Lines logged per cause per window before suppression. */
    private readonly burst = DEFAULT_LOG_BURST,
  ) {}

  readonly warn = (cause: string, obj: object, msg: string): void => this.write('warn', cause, obj, msg);
  readonly info = (cause: string, obj: object, msg: string): void => this.write('info', cause, obj, msg);
  readonly error = (cause: string, obj: object, msg: string): void => this.write('error', cause, obj, msg);

  /** Writes every pending "N more suppressed" line now (shutdown); windows start afresh. */
  flush(): void {
    for (const cause of [...this.states.keys()]) this.close(cause);
  }

  private write(level: Level, cause: string, obj: object, msg: string): void {
    const t = Date.now();
    let s = this.states.get(cause);
    if (s !== undefined && t - s.windowStart >= DEFAULT_LOG_WINDOW_MS) {
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
        s.emitted === this.burst ? `${msg} (further '${cause}' messages are counted for ${DEFAULT_LOG_WINDOW_MS / 1000} s)` : msg,
      );
      return;
    }
    s.suppressed++;
    if (s.timer === undefined) {
      s.timer = setTimeout(() => this.close(cause), Math.max(0, s.windowStart + DEFAULT_LOG_WINDOW_MS - t));
      s.timer.unref();
    }
  }

  private close(cause: string): void {
    const s = this.states.get(cause);
    if (s === undefined) return;
    if (s.timer !== undefined) clearTimeout(s.timer);
    this.states.delete(cause);
    if (s.suppressed > 0) {
      const seconds = Math.max(1, Math.round((Date.now() - s.windowStart) / 1000));
      this.log[s.level](
        { cause, suppressed: s.suppressed },
        `${s.suppressed} more '${cause}' messages suppressed in the last ${seconds} s`,
      );
    }
  }
}
