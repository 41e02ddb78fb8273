/**
 * --log-file and -d: a detached daemon (no terminal, no journal) logs to a file a user can read. The
 * real `-d` daemon, dropped to uid nobody, appends to a file root opened for it, across a restart in
 * place; a link is refused; -d alone logs to the documented default.
 */
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { FakeHost } from '../support/fake-host.js';
import { BIN, ensureBuilt, hostArgs, LegacyClient, tempDir, waitFor } from './support/daemon-process.js';
import { processEnded } from '../support/wait.js';
import { DEFAULT_DAEMON_LOG_FILE, logFileFrom } from '../../src/cli/commands/start-daemon.js';
import { isRoot } from '../support/env.js';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function setup(): { host: FakeHost; dir: string; sock: string; pidfile: string; log: string } {
  const host = new FakeHost();
  host.writePackageMsr(0, 0x606, 0xa1003n);
  fs.chmodSync(host.dir, 0o755);
  const dir = tempDir('vmsr-log-file-');
  fs.chmodSync(dir, 0o755);
  cleanups.push(() => {
    host.cleanup();
    fs.rmSync(dir, { recursive: true, force: true });
  });
  return { host, dir, sock: path.join(dir, 'h.sock'), pidfile: path.join(dir, 'h.pid'), log: path.join(dir, 'helper.log') };
}

function run(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  ensureBuilt();
  return new Promise((resolve) =>
    execFile(process.execPath, [BIN, ...args], { timeout: 30_000 }, (e, stdout, stderr) =>
      resolve({ code: e ? Number((e as { code?: number }).code ?? 1) : 0, stdout, stderr }),
    ),
  );
}

function records(file: string): Record<string, unknown>[] {
  if (!fs.existsSync(file)) return [];
  return fs
    .readFileSync(file, 'utf8')
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l) as Record<string, unknown>);
}

function killLater(pid: number): void {
  cleanups.push(() => {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      /* gone */
    }
  });
}

describe('--log-file', () => {
  test('a -d daemon dropped to nobody appends its log to --log-file, opened by root (0640), and goes on appending after a restart in place', async (ctx) => {
    if (!isRoot()) return ctx.skip('needs root: the daemon drops to -u nobody after opening the file');
    const { host, sock, pidfile, log } = setup();
    fs.writeFileSync(log, 'an earlier line\n'); // appended to, never truncated
    fs.chmodSync(log, 0o600);
    const r = await run(['-d', '-k', sock, '-f', pidfile, '-u', 'nobody', '--log-file', log, ...hostArgs(host)]);
    expect(r).toEqual({ code: 0, stdout: '', stderr: '' });
    const daemonPid = Number(fs.readFileSync(pidfile, 'utf8').trim());
    killLater(daemonPid);
    const st = fs.statSync(log);
    expect(st.uid).toBe(0); // root's file: the dropped daemon writes through the fd it was given
    expect(fs.readFileSync(log, 'utf8').startsWith('an earlier line\n')).toBe(true);
    // The records after the line that was there.
    const recs = () => {
      const text = fs.readFileSync(log, 'utf8').split('\n').slice(1).join('\n');
      return text
        .split('\n')
        .filter((l) => l !== '')
        .map((l) => JSON.parse(l) as Record<string, unknown>);
    };
    await waitFor(() => recs().some((x) => String(x.msg).startsWith('Listening on')), 'the log file to say it listens');
    // JSON lines, the daemon's pid under pid.
    expect(recs().every((x) => x.pid === daemonPid && x.name === 'vmsr-helper')).toBe(true);
    const c = await LegacyClient.connect(sock);
    cleanups.push(() => c.close());
    expect(await c.request(0x606, 0, process.pid)).toBe(0xa1003n);
    // A restart in place re-executes the daemon as nobody: fd 2 is the same file, nothing reopened.
    process.kill(daemonPid, 'SIGHUP');
    await waitFor(
      () => recs().some((x) => String(x.msg).startsWith('handed over')),
      'the restart to be logged in the file',
      undefined,
      20_000,
    );
    expect(await c.request(0x606, 0, process.pid)).toBe(0xa1003n);
    process.kill(daemonPid, 'SIGTERM');
    await waitFor(() => processEnded(daemonPid), 'the daemon to stop');
    expect(recs().at(-1)).toMatchObject({ pid: daemonPid });
    expect(fs.statSync(log).mode & 0o777).toBe(0o600); // an existing file keeps its mode
  });

  test('a new log file is created mode 0640, and a symbolic link is refused with the reason', async (ctx) => {
    if (!isRoot()) return ctx.skip('needs root: the daemon opens the MSR files as root');
    const { host, dir, sock, log } = setup();
    const child = execFile(process.execPath, [BIN, '-k', sock, '--log-file', log, ...hostArgs(host)]);
    cleanups.push(() => child.kill('SIGKILL'));
    await waitFor(() => records(log).some((x) => String(x.msg).startsWith('Listening on')), 'the log file to say it listens');
    expect(fs.statSync(log).mode & 0o777).toBe(0o640);
    child.kill('SIGTERM');

    const link = path.join(dir, 'link.log');
    fs.symlinkSync(path.join(dir, 'elsewhere'), link);
    const r = await run(['-k', path.join(dir, 'b.sock'), '--log-file', link, ...hostArgs(host)]);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain(`cannot open the log file ${link}: it is a symbolic link; give --log-file a path`);
    expect(fs.existsSync(path.join(dir, 'elsewhere'))).toBe(false);
  });

  test('-d without --log-file logs to the default file, and --log-file is made absolute', () => {
    expect(logFileFrom({ daemon: true })).toBe(DEFAULT_DAEMON_LOG_FILE);
    expect(DEFAULT_DAEMON_LOG_FILE).toBe('/var/log/qemu-vmsr-helper.log');
    expect(logFileFrom({})).toBeUndefined();
    expect(logFileFrom({ logFile: 'x.log' })).toBe(path.resolve('x.log'));
    expect(() => logFileFrom({ logFile: '' })).toThrow(/--log-file: empty path/);
  });
});
