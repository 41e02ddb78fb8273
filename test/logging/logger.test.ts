/**
 * Log lines as their reader needs them: syslog priorities under journald (the real daemon, its
 * stderr on a file named by JOURNAL_STREAM the way systemd names the journal's stream), readable
 * lines on a terminal, JSON elsewhere.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { createLogger, formatJournalLine, formatPrettyLine, isJournalStream, SYSLOG_PRIORITY } from '../../src/logging/logger.js';
import { BIN, ensureBuilt, hostArgs, LegacyClient, startHelper, tempDir, waitFor } from '../daemon/support/daemon-process.js';
import { FakeHost } from '../support/fake-host.js';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function dir(): string {
  const d = tempDir('vmsr-logger-');
  cleanups.push(() => fs.rmSync(d, { recursive: true, force: true }));
  return d;
}

/** Logs one record of each level through a real logger in `format` into a file; returns the file's lines. */
function logEachLevel(format: 'journal' | 'pretty' | 'json'): string[] {
  const file = path.join(dir(), 'log');
  const fd = fs.openSync(file, 'w');
  try {
    const log = createLogger('trace', 'vmsr-helper', format, fd);
    const area = log.child({ area: 'v2' });
    area.trace('t-msg');
    area.debug({ vmId: 3 }, 'd-msg');
    log.info({ socket: '/run/x.sock' }, 'i-msg');
    log.warn({ err: 'disk "full"' }, 'w-msg');
    log.error('e-msg\nsecond line');
    log.fatal('f-msg');
  } finally {
    fs.closeSync(fd);
  }
  return fs.readFileSync(file, 'utf8').split('\n').slice(0, -1);
}

describe('journald format', () => {
  test('each level gets its syslog priority as a <N> prefix, one line per record, fields as key=value', () => {
    expect(logEachLevel('journal')).toEqual([
      '<7>[v2] t-msg',
      '<7>[v2] d-msg vmId=3',
      '<6>i-msg socket=/run/x.sock',
      '<4>w-msg err="disk \\"full\\""',
      '<3>e-msg\\nsecond line',
      '<2>f-msg',
    ]);
    expect(SYSLOG_PRIORITY).toMatchObject({ fatal: 2, error: 3, warn: 4, info: 6, debug: 7 });
  });

  test('journalctl -p warning (priorities 0..4) would keep exactly warn, error and fatal', () => {
    const kept = logEachLevel('journal').filter((l) => Number(/^<(\d)>/.exec(l)![1]) <= 4);
    expect(kept.map((l) => l.replace(/^<\d>/, '').split(' ')[0])).toEqual(['w-msg', 'e-msg\\nsecond', 'f-msg']);
    expect(kept).toHaveLength(3);
  });

  test('JOURNAL_STREAM counts only when it names our stderr (a child whose stderr goes elsewhere inherits it)', () => {
    expect(isJournalStream({ JOURNAL_STREAM: '8:1234' }, { dev: 8, ino: 1234 })).toBe(true);
    expect(isJournalStream({ JOURNAL_STREAM: '8:1234' }, { dev: 8, ino: 99 })).toBe(false);
    expect(isJournalStream({}, { dev: 8, ino: 1234 })).toBe(false);
    expect(isJournalStream({ JOURNAL_STREAM: 'junk' }, { dev: 8, ino: 1234 })).toBe(false);
    expect(formatJournalLine('{"level":"warn","msg":"x","pid":1,"time":"t","name":"n"}')).toBe('<4>x\n');
  });

  test('the real daemon under JOURNAL_STREAM: start-up, serving and shutdown lines carry priorities; a start-up error is <2>', async () => {
    ensureBuilt();
    const d = dir();
    const host = new FakeHost();
    cleanups.push(() => host.cleanup());
    host.writePackageMsr(0, 0x606, 0xa1003n);
    const run = (args: string[], logFile: string) => {
      const fd = fs.openSync(logFile, 'w');
      const st = fs.fstatSync(fd);
      // What systemd does for StandardError=journal: stderr is the stream, JOURNAL_STREAM its dev:ino.
      const child = spawn(process.execPath, [BIN, ...args], {
        stdio: ['ignore', 'ignore', fd],
        env: { ...process.env, JOURNAL_STREAM: `${st.dev}:${st.ino}` },
      });
      fs.closeSync(fd);
      const exited = new Promise<number | null>((r) => child.on('exit', (c) => r(c)));
      cleanups.push(() => child.kill('SIGKILL'));
      return { child, exited, text: () => fs.readFileSync(logFile, 'utf8') };
    };
    const sock = path.join(d, 'h.sock');
    const ok = run(['-k', sock, ...hostArgs(host)], path.join(d, 'ok.log'));
    await waitFor(() => ok.text().includes('Listening on'), 'the helper to listen');
    const c = await LegacyClient.connect(sock);
    expect(await c.request(0x606, 0, process.pid)).toBe(0xa1003n);
    c.close();
    ok.child.kill('SIGTERM');
    expect(await ok.exited).toBe(0);
    const lines = ok.text().trimEnd().split('\n');
    for (const l of lines) expect(l).toMatch(/^<[2-7]>\S/);
    expect(lines).toContain(`<6>Listening on ${sock} socket=${sock}`);
    expect(lines.at(-1)).toBe('<6>stopped');

    const bad = run(['-k', 'relative.sock'], path.join(d, 'bad.log'));
    expect(await bad.exited).toBe(1);
    expect(bad.text()).toBe(
      "<2>cannot start: -k/--socket: socket path must be absolute (got 'relative.sock'); e.g. -k /run/qemu-vmsr-helper.sock\n",
    );
  });
});

describe('terminal and JSON formats', () => {
  test('a terminal gets HH:MM:SS.mmm LEVEL [area] message key=value', () => {
    const lines = logEachLevel('pretty');
    expect(lines[1]).toMatch(/^\d\d:\d\d:\d\d\.\d{3} DEBUG \[v2\] d-msg vmId=3$/);
    expect(lines[3]).toMatch(/^\d\d:\d\d:\d\d\.\d{3} WARN {2}w-msg err="disk \\"full\\""$/);
    expect(formatPrettyLine('{"level":"info","time":"2026-01-02T03:04:05.678Z","msg":"m"}')).toMatch(/^\d\d:04:05\.678 INFO {2}m\n$/);
  });

  test('elsewhere one JSON object a line, level by name, ISO time, pid once', () => {
    const recs = logEachLevel('json').map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(recs.map((r) => r.level)).toEqual(['trace', 'debug', 'info', 'warn', 'error', 'fatal']);
    expect(recs[2]).toMatchObject({ msg: 'i-msg', socket: '/run/x.sock', pid: process.pid });
    expect(String(recs[2]!.time)).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    expect(logEachLevel('json')[2]!.match(/"pid"/g)).toHaveLength(1);
  });

  test('the daemon\'s "Listening" record carries pid once (it used to repeat it)', async () => {
    const host = new FakeHost();
    cleanups.push(() => host.cleanup());
    host.writePackageMsr(0, 0x606, 0xa1003n);
    const sock = path.join(dir(), 'h.sock');
    const child = await startHelper(['-k', sock, ...hostArgs(host)]);
    cleanups.push(() => child.stop('SIGKILL'));
    const line = child
      .stderr()
      .split('\n')
      .find((l) => l.includes('"msg":"Listening on'))!;
    expect(line.match(/"pid":/g)).toHaveLength(1);
    expect(JSON.parse(line)).toMatchObject({ level: 'info', pid: child.proc.pid, socket: sock });
    expect(await child.stop()).toBe(0);
  });
});
