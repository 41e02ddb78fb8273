/**
 * pino on stderr, in the form its reader understands: under journald, one line per record prefixed
 * with the syslog priority `<N>` (so `journalctl -p warning` filters); on a terminal, a readable line;
 * anywhere else, one JSON object a line.
 */
import fs from 'node:fs';
import tty from 'node:tty';
import { createRequire } from 'node:module';
import type { DestinationStream, Logger } from 'pino';
import type * as Pino from 'pino';

export type { Logger };

/** The levels of a logger a part logs at, each as (fields, message): a pino Logger is one, a test passes a fake. */
export type LogSink<L extends 'info' | 'warn' | 'error'> = Record<L, (o: object, msg: string) => void>;

export type LogLevel = 'trace' | 'debug' | 'info' | 'warn' | 'error' | 'fatal' | 'silent';

type LogFormat = 'journal' | 'pretty' | 'json';

/** pino level name -> syslog priority (RFC 5424 severity), as journald maps them. */
export const SYSLOG_PRIORITY: Readonly<Record<string, number>> = { fatal: 2, error: 3, warn: 4, info: 6, debug: 7, trace: 7 };

/** JOURNAL_STREAM ("DEV:INODE" of systemd's stream) is inherited by children whose stderr goes elsewhere: it counts if it names ours. */
export function isJournalStream(env: NodeJS.ProcessEnv, stat: { dev: number; ino: number } | null): boolean {
  const m = /^(\d+):(\d+)$/.exec(env.JOURNAL_STREAM ?? '');
  return m !== null && stat !== null && Number(m[1]) === stat.dev && Number(m[2]) === stat.ino;
}

function detectLogFormat(env: NodeJS.ProcessEnv = process.env, fd = 2): LogFormat {
  let stat: fs.Stats | null = null;
  try {
    stat = fs.fstatSync(fd);
  } catch {
    /* closed stderr: no journal */
  }
  if (isJournalStream(env, stat)) return 'journal';
  return tty.isatty(fd) ? 'pretty' : 'json';
}

const HIDDEN = new Set(['level', 'time', 'pid', 'hostname', 'name', 'msg', 'area']);

function value(v: unknown): string {
  if (typeof v === 'string') return /^[\w./:@%+,-]+$/.test(v) ? v : JSON.stringify(v);
  return JSON.stringify(v) ?? String(v);
}

/** `[area] message key=value ...`, never a newline inside. */
function body(rec: Record<string, unknown>): string {
  const fields = Object.entries(rec)
    .filter(([k]) => !HIDDEN.has(k))
    .map(([k, v]) => `${k}=${value(v)}`);
  const msg = String(rec.msg ?? '');
  const area = typeof rec.area === 'string' ? `[${rec.area}] ` : '';
  return `${area}${msg}${fields.length ? ` ${fields.join(' ')}` : ''}`.replace(/\r?\n/g, '\\n');
}

export function formatJournalLine(json: string): string {
  const rec = JSON.parse(json) as Record<string, unknown>;
  return `<${SYSLOG_PRIORITY[String(rec.level)] ?? 6}>${body(rec)}\n`;
}

export function formatPrettyLine(json: string): string {
  const rec = JSON.parse(json) as Record<string, unknown>;
  const t = new Date(typeof rec.time === 'string' || typeof rec.time === 'number' ? rec.time : Date.now());
  const hms = `${t.toTimeString().slice(0, 8)}.${String(t.getMilliseconds()).padStart(3, '0')}`;
  const level = String(rec.level ?? 'info').toUpperCase();
  return `${hms} ${level.padEnd(5)} ${body(rec)}\n`;
}

/** A synchronous stderr writer that reformats each pino line (logs must not be lost on exit). */
function lineStream(format: (json: string) => string, fd: number): DestinationStream {
  return {
    write(chunk: string) {
      let out: string;
      try {
        out = format(chunk);
      } catch {
        out = chunk; // not pino's JSON: pass it through rather than lose it
      }
      try {
        fs.writeSync(fd, out);
      } catch {
        /* stderr gone: nothing else to tell */
      }
    },
  };
}

/** pino loads with the first logger: the CLI imports this module (levelFromFlags) before it re-executes, and that image never logs. */
export function createLogger(level: LogLevel = 'info', name = 'vmsr-helper', format: LogFormat = detectLogFormat(), fd = 2): Logger {
  const { pino } = createRequire(import.meta.url)('pino') as typeof Pino;
  const common = {
    name,
    level,
    formatters: { level: (label: string) => ({ level: label }) },
    timestamp: pino.stdTimeFunctions.isoTime,
  };
  if (format === 'json') return pino({ ...common, base: { pid: process.pid } }, pino.destination({ fd, sync: true }));
  return pino({ ...common, base: {} }, lineStream(format === 'journal' ? formatJournalLine : formatPrettyLine, fd));
}

/** -v raises to debug, -q lowers to warn; with both, -v wins (commander does not keep their order). */
export function levelFromFlags(opts: { verbose?: boolean; quiet?: boolean }): LogLevel {
  if (opts.verbose) return 'debug';
  if (opts.quiet) return 'warn';
  return 'info';
}
