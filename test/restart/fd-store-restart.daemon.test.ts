/**
 * Restarts through systemd's fd store (docs/daemon.md "Restarts"), against the real systemd booted as
 * PID 1 of a new PID namespace (test/restart/support/service-manager.ts): a .socket unit and a
 * Type=notify service with FileDescriptorStoreMax=, the real daemon, and the QEMU-like legacy client
 * (legacy-client.py) sending without pause. `systemctl restart` stores the connections and the state
 * (FDSTORE=1) and the next start adopts them from LISTEN_FDS; `systemctl stop` then `start` drops the
 * store (systemd 252 to 254 without FileDescriptorStorePreserve=): the connection is lost, and the new
 * daemon says it starts fresh. Which manager ran, and why, is printed; where systemd cannot run here
 * the tests are skipped with the reason printed.
 */
import { describe, expect, test } from 'vitest';
import { waitFor } from '../support/wait.js';
import { legacyCounters } from './support/legacy-counters.js';
import { expectEveryRequestAnsweredOnce, legacyClientProcess } from './support/legacy-client.js';
import { countMsg, fdStoreBedForFile, type RealSystemd, UNIT } from './support/service-manager.js';

const RESTARTS = 5;

const bed = fdStoreBedForFile('vmsr-fdstore-', 'fd-store restarts');

async function startService(m: RealSystemd): Promise<void> {
  const before = countMsg(bed.log(), 'Listening on');
  m.systemctl('start', `${UNIT}.service`);
  await waitFor(() => countMsg(bed.log(), 'Listening on') > before, 'the service to listen', undefined, 30_000);
}

describe("restarts through systemd's fd store", () => {
  test('a legacy client is answered exactly once per request across 5 systemctl restarts, its counters carried', async (ctx) => {
    if (bed.manager === null) return ctx.skip();
    const m = bed.manager;
    await startService(m);
    const client = legacyClientProcess(bed.sock, { inside: (a) => m.inside(a) });
    await client.ready;
    const waits: number[] = [];
    for (let i = 0; i < RESTARTS; i++) {
      const before = countMsg(bed.log(), 'handed over:');
      const pidBefore = m.show('MainPID');
      const t0 = Date.now();
      m.systemctl('restart', `${UNIT}.service`);
      await waitFor(() => countMsg(bed.log(), 'handed over:') > before, `restart ${i + 1} to serve again`, undefined, 30_000);
      waits.push(Date.now() - t0);
      expect(m.show('MainPID')).not.toBe(pidBefore);
      // The new start took the hand-over's fds back out of the store (FDSTOREREMOVE=1): what stays is
      // what a crash would need (docs/daemon.md "Crashes"), the client's connection and the new start's checkpoint.
      await waitFor(
        () => m.show('NFileDescriptorStore') === '2',
        'the fd store to hold the kept connection and one checkpoint',
        undefined,
        5000,
      );
      await new Promise((r) => setTimeout(r, 300));
    }
    const s = await client.done();
    console.log(
      `${bed.why}: ${RESTARTS} systemctl restarts; systemctl to serving (ms): ${waits.join(', ')}; ` +
        `longest request wait ${s.maxWaitMs.toFixed(1)} ms over ${s.sent} requests`,
    );
    const text = bed.log();
    expect(countMsg(text, 'handed over to the fd store (FDSTORE=1)')).toBe(RESTARTS);
    expect([...text.matchAll(/"msg":"handed over: (\d+) connections/g)].map((x) => x[1])).toEqual(Array(RESTARTS).fill('1'));
    expect(text).toContain('"state":true');
    expectEveryRequestAnsweredOnce(s);
    expect((await legacyCounters(bed.sock, (a) => m.inside(a))).ok).toBe(s.sent);
  }, 180_000);

  test('systemctl stop then start loses the connections and the new daemon says it starts fresh', async (ctx) => {
    if (bed.manager === null) return ctx.skip();
    const m = bed.manager;
    if (m.show('ActiveState') !== 'active') await startService(m);
    const client = legacyClientProcess(bed.sock, { inside: (a) => m.inside(a) });
    await client.ready;
    await new Promise((r) => setTimeout(r, 200));
    const stored = countMsg(bed.log(), 'handed over to the fd store (FDSTORE=1)');
    m.systemctl('stop', `${UNIT}.service`);
    // The daemon stored its parts, and systemd dropped them with the stopped service.
    expect(countMsg(bed.log(), 'handed over to the fd store (FDSTORE=1)')).toBe(stored + 1);
    expect(m.show('NFileDescriptorStore')).toBe('0');
    const fresh = countMsg(bed.log(), 'a fresh start');
    await startService(m);
    await waitFor(() => countMsg(bed.log(), 'a fresh start') > fresh, 'the new start to say it starts fresh', undefined, 5000);
    await client.exited;
    const s = await client.done();
    // Its connection ended with the stopped helper: a reply never came, or a request could not be sent.
    expect(s.error).toMatch(/closed by the helper|Broken pipe|Connection reset/);
    expect(s.answered).toBeGreaterThanOrEqual(s.sent - 1);
  }, 120_000);
});
