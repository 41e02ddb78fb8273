/**
 * Every command that prints ends quietly when the reader of its output goes away, as `cat` does: run
 * by bash into a reader that closes the pipe at once (`true`), after one line (`head -1`) or after
 * one byte (`head -c 1`), against a real daemon (the demo's: synthetic energy, a discovered demo VM),
 * its exit status is 0 (it had written everything before) or 141 (128 + SIGPIPE), and it says nothing
 * on stderr. The demo itself, whose banner finds the pipe closed, stops its children and removes its
 * directory.
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { BIN, spawnHelper, tempDir, waitFor, type DaemonChild } from '../daemon/support/daemon-process.js';
import { missing } from '../support/env.js';

/** Readers that close the pipe: at once, after one line, after one byte. */
const READERS = ['true', 'head -1', 'head -c 1'];

/** `cmd | reader` by bash: the command's exit status and its stderr. */
function throughClosingReader(args: string[], reader: string, dir: string, stdin = ''): { status: number; stderr: string } {
  const err = path.join(dir, 'stderr');
  const quoted = [process.execPath, BIN, ...args].map((a) => `'${a.replace(/'/g, `'\\''`)}'`).join(' ');
  const r = spawnSync('bash', ['-c', `${quoted} 2>"$1" | ${reader} >/dev/null; echo "\${PIPESTATUS[0]}"`, 'bash', err], {
    input: stdin,
    encoding: 'utf8',
    timeout: 60_000,
  });
  if (r.error) throw r.error;
  return { status: Number(r.stdout.trim()), stderr: fs.readFileSync(err, 'utf8') };
}

describe('a command whose output pipe closes', () => {
  const why = missing({ command: 'bash' }) ?? missing({ command: 'head' });
  let demo: DaemonChild | null = null;
  let dir = '';
  let socket = '';
  let vmPid = 0;
  let vmTid = 0;

  beforeAll(async () => {
    if (why) return;
    dir = tempDir('vmsr-pipe-');
    demo = spawnHelper(['demo', '--listen', '127.0.0.1:0']);
    // Start-up is three Node processes: 2 to 5 s when idle, far more on a loaded machine.
    await waitFor(() => /Ctrl-C/.test(demo!.stderr()), "the demo's banner", demo, 60_000);
    socket = /socket (\/\S+\/vmsr\.sock)/.exec(demo.stderr())![1]!;
    vmPid = Number(/demo VM {3}pid (\d+)/.exec(demo.stderr())![1]);
    vmTid = Number(
      fs.readdirSync(`/proc/${vmPid}/task`).find((t) => fs.readFileSync(`/proc/${vmPid}/task/${t}/comm`, 'utf8').startsWith('CPU 0/KVM')),
    );
  }, 90_000);
  afterAll(async () => {
    await demo?.stop('SIGTERM');
    if (dir) fs.rmSync(dir, { recursive: true, force: true });
  });

  test('ends with status 0 or 141 and nothing on stderr, for every printing command and every reader', (ctx) => {
    if (why) return ctx.skip(why);
    const commands: { args: string[]; stdin?: string }[] = [
      { args: ['--version'] },
      { args: ['--help'] },
      { args: ['help', 'stats'] },
      { args: ['replay'] },
      { args: ['replay', '--json'] },
      { args: ['stats', '-k', socket] },
      { args: ['stats', '-k', socket, '--once'] },
      { args: ['stats', '-k', socket, '--json', '--interval', '0.1'] },
      { args: ['watch', '-k', socket, String(vmPid)] },
      { args: ['watch', '-k', socket, String(vmPid), '--json'] },
      { args: ['watch', '-k', socket, '--pid', String(vmPid), '--vcpus', `${vmTid}:0`] },
      { args: ['hash-password', '--cost', '4'], stdin: 'secret\n' },
      { args: ['reload', '-k', socket] },
    ];
    const seen: string[] = [];
    for (const c of commands) {
      for (const reader of READERS) {
        const r = throughClosingReader(c.args, reader, dir, c.stdin);
        seen.push(`${c.args.join(' ')} | ${reader}: ${r.status}`);
        expect({ command: c.args.join(' '), reader, stderr: r.stderr }).toEqual({ command: c.args.join(' '), reader, stderr: '' });
        expect([0, 141], `${c.args.join(' ')} | ${reader}`).toContain(r.status);
      }
    }
    // The streaming ones met the closed pipe (141) at least with the reader that closes at once.
    for (const streaming of ['stats -k', 'watch -k', 'replay --json'])
      expect(
        seen.filter((s) => s.startsWith(streaming) && s.endsWith('| true: 141')),
        seen.join('\n'),
      ).not.toEqual([]);
  }, 600_000);

  test('demo into a reader that closes at once stops its children, removes its directory and ends with status 141', (ctx) => {
    if (why) return ctx.skip(why);
    const r = throughClosingReader(['demo', '--no-vm', '--listen', '127.0.0.1:0', '--duration', '120'], 'true', dir);
    expect(r.status, r.stderr).toBe(141);
    expect(r.stderr).toMatch(/vmsr-helper demo: stopping \(SIGPIPE received\)/);
    expect(r.stderr).not.toMatch(/EPIPE|Error:|\n\s+at /);
    const made = /Listening on (\/\S+\/vmsr\.sock)/.exec(r.stderr)?.[1];
    expect(made, r.stderr).toBeDefined();
    expect(fs.existsSync(path.dirname(made!))).toBe(false);
  }, 180_000);
});
