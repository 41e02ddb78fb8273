/**
 * A log-rotation style `kill -HUP` stopped the daemon, and QEMU never reconnects,
 * so every guest's energy counter froze. The signal comes from a real process of the dropped uid.
 */
import { describe, expect, test } from 'vitest';
import { SIGHUP_MESSAGE } from '../../src/os/sighup.js';
import { hostArgs, LegacyClient, startHelper, waitFor } from '../daemon/support/daemon-process.js';
import { fakeHost, killAs, NOBODY, notRoot, onCleanup, sleep, startExporterProcess, track } from './support.js';

/** After the handler's line: long enough for a handler that went on to end the process to have ended it. */
const SETTLE_MS = 500;

describe('SIGHUP', () => {
  test('SIGHUP restarts the daemon in place under -u nobody: the same connection is answered after it, with no more privilege than before', async (ctx) => {
    const why = notRoot();
    if (why) return ctx.skip(why);
    const { host, sock } = fakeHost();
    const child = track(await startHelper(['-k', sock, '-u', 'nobody', ...hostArgs(host)]));
    const c = await LegacyClient.connect(sock);
    onCleanup(() => c.close());
    expect(await c.request(0x606, 0, process.pid)).toBe(0xa1003n);
    expect(await killAs(NOBODY, 'HUP', child.proc.pid!)).toBe(0);
    await waitFor(
      () => child.stderr().includes('"msg":"handed over: 1 connections"'),
      'the restart in place (its binary check may take 30 s on a busy host)',
      child,
      60_000,
    );
    expect(child.proc.exitCode).toBeNull();
    expect(c.closed).toBe(false);
    expect(await c.request(0x606, 0, process.pid)).toBe(0xa1003n);
    // The re-executed image holds what the old one held: uid nobody, no capability, NoNewPrivs.
    const privileges = child
      .stderr()
      .split('\n')
      .filter((l) => l.includes('"area":"privileges"'))
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(privileges.length).toBeGreaterThanOrEqual(2);
    const after = privileges[privileges.length - 1]!;
    expect(after).toMatchObject({
      uid: [NOBODY, NOBODY, NOBODY, NOBODY],
      capEff: '0000000000000000',
      capPrm: '0000000000000000',
      capBnd: '0000000000000000',
      noNewPrivs: 1,
    });
    // SIGTERM still stops it cleanly.
    expect(await child.stop('SIGTERM')).toBe(0);
  });

  test('the exporter keeps serving after SIGHUP', async (ctx) => {
    const why = notRoot();
    if (why) return ctx.skip(why);
    const { sock } = fakeHost();
    const { child, url } = await startExporterProcess(sock, NOBODY);
    expect(await killAs(NOBODY, 'HUP', child.proc.pid!)).toBe(0);
    // The handler's line says the signal was taken (SIGHUP's default would have ended it at once);
    // a busy host may take seconds to run it.
    await waitFor(() => child.stderr().includes(SIGHUP_MESSAGE), 'the exporter to log that it took the SIGHUP', child);
    await sleep(SETTLE_MS);
    expect(child.proc.exitCode).toBeNull();
    expect((await fetch(url)).status).toBe(200);
  });
});
