/**
 * An exporter outside the helper's observer group, against the real daemon: the refusal names the
 * group by name (and gid), says so once, and its "retrying every 10 s" is what the exporter does.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { FakeHost } from '../support/fake-host.js';
import { hostArgs, spawnHelper, startHelper, tempDir, waitFor, type DaemonChild } from '../daemon/support/daemon-process.js';
import { DEFAULT_BACKOFF } from '../../src/exporter/observer-session.js';
import { missing } from '../support/env.js';
import { groupNameOf } from '../../src/os/privileges/accounts.js';
import { MSR_PKG_ENERGY_STATUS, MSR_RAPL_POWER_UNIT } from '../../src/msr/registers.js';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const NOBODY = 65534;
/** An existing named group (Debian's `users`, gid 100) stands for vmsr-observers: nothing to create. */
const GROUP = 'users';
const GID = 100;

type Rec = { level: string; msg: string; time: string };

function records(child: DaemonChild): Rec[] {
  return child
    .stderr()
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as Rec);
}

describe('observer group refusal', () => {
  test('an exporter outside the observer group is told the group by name once, and retries every 10 s as it says', async (ctx) => {
    const why = missing({ root: true });
    if (why) return ctx.skip(why);
    if (groupNameOf(GID) !== GROUP) return ctx.skip(`needs group ${GROUP} with gid ${GID} (Debian's)`);
    const fake = new FakeHost();
    fake.writePackageMsr(0, MSR_RAPL_POWER_UNIT, 0xa0e03n);
    fake.writePackageMsr(0, MSR_PKG_ENERGY_STATUS, 0x1000n);
    fs.chmodSync(fake.dir, 0o755);
    const dir = tempDir('vmsr-refusal-');
    fs.chmodSync(dir, 0o755);
    cleanups.push(
      () => fake.cleanup(),
      () => fs.rmSync(dir, { recursive: true, force: true }),
    );
    const sock = path.join(dir, 'helper.sock');
    const helper = await startHelper(['-k', sock, ...hostArgs(fake), '--socket-mode', '0666', '--observer-group', GROUP]);
    cleanups.push(() => helper.stop('SIGKILL'));
    // -v: each quiet retry is a debug line, so the interval can be read off the log.
    const exporter = spawnHelper(['exporter', '-k', sock, '--listen', '127.0.0.1:0', '-v'], { uid: NOBODY, gid: NOBODY });
    cleanups.push(() => exporter.stop('SIGKILL'));
    const retries = () => records(exporter).filter((r) => r.msg === 'still refused by the helper');
    // The first retry comes 10 s after the refusal: wait up to 10 s more on this shared, loaded machine.
    await waitFor(() => retries().length >= 1, 'a retry after the refusal', exporter, DEFAULT_BACKOFF.maxMs + 10_000);
    const refusals = records(exporter).filter((r) => r.msg.includes('refuses this exporter'));
    expect(refusals).toHaveLength(1);
    const msg = refusals[0]!.msg;
    expect(refusals[0]!.level).toBe('error');
    expect(msg).toContain(`add this user to the helper's --observer-group, group '${GROUP}' (gid ${GID})`);
    expect(msg).toContain(`retrying every ${DEFAULT_BACKOFF.maxMs / 1000} s`);
    // Named once: the group and the advice are not repeated in the line.
    expect(msg.split(`'${GROUP}'`)).toHaveLength(2);
    expect(msg.split('--observer-group')).toHaveLength(2);
    // The retry came after the interval it announced: a timer never fires early (1 ms for the log's
    // millisecond times); the upper margin (5 s) is for a loaded 2-core machine.
    const gap = Date.parse(retries()[0]!.time) - Date.parse(refusals[0]!.time);
    expect(gap).toBeGreaterThanOrEqual(DEFAULT_BACKOFF.maxMs - 1);
    expect(gap).toBeLessThan(DEFAULT_BACKOFF.maxMs + 5_000);
  }, 40_000);
});
