/**
 * `stats --json` and `watch --json` begin with the daemon's record (its socket, its energy source, its
 * domains), against a real daemon with no VM (discovery off): `stats` prints that record alone at each
 * refresh, so "no VM" reads differently from "nothing answered"; a user who may not read the host's
 * statistics (not root, not in the observer group) gets the record with nulls, never a made-up source.
 */
import { execFile } from 'node:child_process';
import { afterEach, describe, expect, test } from 'vitest';
import { BIN, ensureBuilt } from '../daemon/support/daemon-process.js';
import { startOpenDaemon } from '../daemon/support/open-daemon.js';
import { isRoot } from '../support/env.js';

const NOBODY = 65534;
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function cli(args: string[], uid?: number): Promise<{ code: number; stdout: string; stderr: string }> {
  ensureBuilt();
  return new Promise((resolve) =>
    execFile(process.execPath, [BIN, ...args], { timeout: 30_000, ...(uid !== undefined ? { uid, gid: uid } : {}) }, (e, stdout, stderr) =>
      resolve({ code: e ? Number((e as { code?: number }).code ?? 1) : 0, stdout, stderr }),
    ),
  );
}

const records = (text: string) =>
  text
    .trim()
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as Record<string, unknown>);

describe('the JSON output of stats and watch', () => {
  test('starts with the daemon record, alone with no VM, for every user and way of asking', async (ctx) => {
    const { sock } = await startOpenDaemon({ units: 40, extra: ['--no-discovery'], onCleanup: (c) => cleanups.push(c) });
    const users: { who: string; uid?: number; said: { energy_source: string | null; domains: string[] | null } }[] = [
      {
        who: 'this user',
        ...(isRoot() ? {} : {}),
        said: isRoot() ? { energy_source: 'msr', domains: ['package'] } : { energy_source: null, domains: null },
      },
    ];
    if (isRoot()) users.push({ who: 'uid nobody', uid: NOBODY, said: { energy_source: null, domains: null } });
    else ctx.annotate("not root: the uid-nobody case (no right to the host statistics) is this user's own");
    for (const u of users) {
      const daemon = { type: 'daemon', socket: sock, ...u.said };
      const once = await cli(['stats', '-k', sock, '--once', '--json'], u.uid);
      expect({ who: u.who, code: once.code, stderr: once.stderr }).toEqual({ who: u.who, code: 0, stderr: '' });
      expect(records(once.stdout), u.who).toEqual([daemon]);
      // Refreshing: the daemon's record again at each refresh, nothing else (stopped by the closed pipe after 3 lines).
      const refreshes = await new Promise<string>((resolve) => {
        const child = execFile(process.execPath, [BIN, 'stats', '-k', sock, '--json', '--interval', '0.1'], {
          timeout: 30_000,
          ...(u.uid !== undefined ? { uid: u.uid, gid: u.uid } : {}),
        });
        let out = '';
        child.stdout!.on('data', (d: Buffer) => {
          out += d.toString();
          if (out.split('\n').length > 3) {
            child.stdout!.destroy();
            resolve(out);
          }
        });
      });
      expect(records(refreshes.split('\n').slice(0, 3).join('\n')), u.who).toEqual([daemon, daemon, daemon]);
      // watch of a process registered here (this test's own, as a one-vCPU VM): the daemon's record, then "registered".
      const watch = await cli(['watch', '-k', sock, '--pid', String(process.pid), '--vcpus', `${process.pid}:0`, '--count', '1', '--json']);
      expect(watch.stderr).toBe('');
      const [first, second] = records(watch.stdout);
      expect(first).toEqual({ type: 'daemon', socket: sock, ...users[0]!.said });
      expect(second).toMatchObject({ type: 'registered', pid: process.pid, energy_source: users[0]!.said.energy_source });
    }
  }, 120_000);
});
