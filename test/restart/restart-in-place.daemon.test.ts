/**
 * Restarts in place (docs/daemon.md "Restarts") with real parts: the real daemon, real signals, real
 * Unix sockets, and a QEMU-like legacy client in its own process (test/restart/legacy-client.py) that
 * sends requests without pause, some split across two writes, while the daemon is restarted 5 times
 * by SIGHUP and 5 times by `vmsr-helper reload`. Every request is answered exactly once, none waits
 * long enough to be a hang, the energy counter never goes backwards, and the daemon's legacy counters
 * (carried over every restart) count every request. The longest wait is printed against the 0.5 s goal:
 * a goal (docs/daemon.md "Restarts" says where it stands), checked by timing, so not asserted here.
 */
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { FakeHost } from '../support/fake-host.js';
import { EnergyPump } from '../support/energy-pump.js';
import { BIN, hostArgs, listenings, startHelper, tempDir, waitFor, type DaemonChild } from '../daemon/support/daemon-process.js';
import { legacyCounters } from './support/legacy-counters.js';
import { expectEveryRequestAnsweredOnce, legacyClientProcess } from './support/legacy-client.js';

/** The goal for the longest wait, printed: QEMU waits for a reply (no timeout), but a late one stretches its period. */
const QEMU_REPLY_WAIT_MS = 500;
const restarts = (h: DaemonChild) => h.stderr().split('"msg":"handed over:').length - 1;

describe('restart in place with a QEMU-like client sending requests', () => {
  let host: FakeHost;
  let helper: DaemonChild;
  let sock: string;
  let pump: EnergyPump;

  beforeAll(async () => {
    host = new FakeHost({ packages: [0, 0], online: [0, 1] });
    host.writePackageMsr(0, 0x606, 0xa1003n);
    pump = new EnergyPump(host, { msr: 0x611, start: 0x1000, unitsPerSecond: 50_000 });
    pump.start();
    sock = path.join(tempDir(), 'helper.sock');
    helper = await startHelper(['-k', sock, ...hostArgs(host), '--interval', '0.1']);
  });
  afterAll(async () => {
    pump.stop();
    await helper?.stop();
    host?.cleanup();
  });

  test('every request is answered exactly once, none hangs, across 5 restarts by SIGHUP and 5 by vmsr-helper reload', async () => {
    const client = legacyClientProcess(sock);
    await client.ready;
    const waits: number[] = [];
    for (let i = 0; i < 10; i++) {
      const before = restarts(helper);
      const listened = listenings(helper);
      const t0 = Date.now();
      if (i < 5) helper.proc.kill('SIGHUP');
      else execFileSync(process.execPath, [BIN, 'reload', '-k', sock], { stdio: 'pipe' });
      await waitFor(() => restarts(helper) > before, `restart ${i + 1} to serve again`, helper, 30_000);
      waits.push(Date.now() - t0);
      await waitFor(() => listenings(helper) > listened, `restart ${i + 1} to take the next restart`, helper, 30_000);
      await new Promise((r) => setTimeout(r, 300));
    }
    const s = await client.done();
    const stamp = /"preparedMs":(\d+)/g;
    console.log(
      `restarts: 5 by SIGHUP, 5 by reload; signal to serving (ms): ${waits.join(', ')}; longest request wait ${s.maxWaitMs.toFixed(1)} ms over ${s.sent} requests (goal under ${QEMU_REPLY_WAIT_MS} ms: ${s.maxWaitMs < QEMU_REPLY_WAIT_MS ? 'met' : 'NOT met'}); prepare (ms, check included): ${[...helper.stderr().matchAll(stamp)].map((m) => m[1]).join(', ')}`,
    );
    expectEveryRequestAnsweredOnce(s);
    // The legacy counters went on across every restart: each request of the client counted once as answered.
    expect(await legacyCounters(sock)).toEqual({ ok: s.sent, refused: 0, failed: 0 });
  }, 180_000);
});
