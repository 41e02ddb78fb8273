/** pino to stderr: one JSON object a line, which journald stores as is. */
import { pino, type Logger } from 'pino';

export type { Logger };

export type LogLevel = 'trace' | 'debug' | 'info' | 'warn' | 'error' | 'fatal' | 'silent';

export function createLogger(level: LogLevel = 'info', name = 'vmsr-helper'): Logger {
  return pino({ name, level, base: { pid: process.pid } }, pino.destination({ fd: 2, sync: true }));
}

/** -v raises to debug, -q lowers to warn; with both, -v wins (commander does not keep their order). */
export function levelFromFlags(opts: { verbose?: boolean; quiet?: boolean }): LogLevel {
  if (opts.verbose) return 'debug';
  if (opts.quiet) return 'warn';
  return 'info';
}
