/**
 * A QEMU-named process with `-smp 2,sockets=2` starts the second
 * socket's vCPU after exact mode began for it (the model made with one virtual package), then
 * starts and ends short-lived threads. The delta search credited nothing for the new socket's vCPU
 * and never ended: the serving process hung for good. Without the threads it paid the new socket
 * again every window (17.3x). Here the real daemon (-u nobody) answers every window, and what the
 * fake QEMU credits, with QEMU's own arithmetic, is what the helper attributed.
 */
import { describe, expect, test } from 'vitest';
import { onCleanup, notRoot, NOBODY, said, startExactDaemon } from './support.js';
import { VmsrFakeQemu, type FakeWindow } from '../support/vmsr-fake-qemu.js';
import { LegacyClient, type DaemonChild } from '../daemon/support/daemon-process.js';
import net from 'node:net';

const why = notRoot();

/** The helper's windows as its debug lines say (`exact`: the energy it attributed, in units). */
function helperWindows(d: DaemonChild): { window: number; exact: number }[] {
  return d
    .stderr()
    .split('\n')
    .filter((l) => l.includes('"msg":"guest window"'))
    .map((l) => JSON.parse(l) as { window: number; exact: number });
}

/** A fake QEMU of 2 sockets x 1 vCPU, as nobody, its first vCPU busy; resolves once exact mode began for it. */
async function hotPluggable(sock: string, dir: string, exe: string, daemon: DaemonChild): Promise<VmsrFakeQemu> {
  const q = new VmsrFakeQemu({ exe, socket: sock, logDir: dir, sockets: 2, perSocket: 1, vcpus: 1, uid: NOBODY });
  onCleanup(() => q.kill());
  await q.ready();
  await q.cmd('spin 0');
  await said(daemon, 'guest energy: exact for this VM from this window on');
  return q;
}

/** A fresh connection's request is answered within `ms`: the serving process is not hung. */
async function answersWithin(sock: string, ms: number): Promise<void> {
  const c = new LegacyClient(net.connect(sock));
  await c.ready;
  const started = Date.now();
  const reply = await Promise.race([c.request(0x606, 0, process.pid), new Promise<null>((r) => setTimeout(() => r(null), ms))]);
  c.close();
  expect(reply, `a request answered within ${ms} ms (took ${Date.now() - started} ms)`).not.toBeNull();
}

describe.skipIf(why !== null)('exact mode and a socket whose vCPU starts late', () => {
  if (why !== null) console.log(`skipped: ${why}`);

  test('a hot-plugged socket with short-lived threads in its windows hangs no serving process', async () => {
    const { daemon, sock, dir, exe } = await startExactDaemon();
    const q = await hotPluggable(sock, dir, exe, daemon);
    const at = (await q.windowsClosed(q.windows().length + 2)).length;
    await q.cmd('add 1');
    await q.cmd('spin 1');
    // Only the new socket's vCPU runs: QEMU's credit comes from it alone.
    await q.cmd('idle 0');
    // Short-lived threads, each running 0.2 s and gone 2.5 s after it began, one every 4 s: a window in
    // which one begins (QEMU does not list it; the helper must solve the window on its reads), one in
    // which one ends (QEMU listed it: its tick delta underflows), and windows with neither.
    const churn = setInterval(() => void q.cmd('churn 2.5').catch(() => {}), 4000);
    onCleanup(() => clearInterval(churn));
    // Waited for: 16 more windows, each about 1 s; a hung helper answers none and the fake's wait fails.
    await q.windowsClosed(at + 16, 180_000);
    clearInterval(churn);
    await answersWithin(sock, 10_000);
    expect(daemon.proc.exitCode).toBeNull();
    // The helper kept closing windows for this VM (it did not go raw to escape).
    expect(helperWindows(daemon).length).toBeGreaterThanOrEqual(10);
  }, 400_000);

  test('a hot-plugged socket is paid what the helper attributed, not again every window', async () => {
    const { daemon, sock, dir, exe } = await startExactDaemon();
    const q = await hotPluggable(sock, dir, exe, daemon);
    await q.windowsClosed(q.windows().length + 2);
    await q.cmd('add 1');
    await q.cmd('spin 1');
    // Two windows for discovery to see the new vCPU, then 16 measured.
    const from = (await q.windowsClosed(q.windows().length + 3)).length;
    const h0 = helperWindows(daemon).at(-1)!;
    const ws: FakeWindow[] = await q.windowsClosed(from + 16, 180_000);
    const h1 = helperWindows(daemon).at(-1)!;
    const given = ws.slice(from).reduce((a, w) => a + w.credited, 0);
    const attributed = h1.exact - h0.exact;
    const second = ws.at(-1)!.counters[1]! - ws[from - 1]!.counters[1]!;
    console.log(
      `hot-plugged socket: QEMU credited ${given} units over ${ws.length - from} windows, the helper attributed ${attributed} ` +
        `over its windows ${h0.window}-${h1.window} (${(given / attributed).toFixed(3)}x); the new socket got ${second}`,
    );
    // The windows of the two counts are not the same ones (up to a window apart at each end): a wide band, far below 17x.
    expect(given / attributed).toBeGreaterThan(0.6);
    expect(given / attributed).toBeLessThan(1.5);
    expect(second).toBeGreaterThan(0);
  }, 400_000);
});
