/**
 * A user of the socket's group holds thousands of connections, each with half a v2 frame, and
 * reopens each as soon as the helper closes it. The incomplete-frame budget (16 MiB) was one queue
 * for everyone: a new QEMU connection waited behind the flood's for 8 to 17.7 s. Now the budget is
 * shared between users: QEMU, of another uid, is read at once, room made by cutting the frames of
 * the user holding the most.
 */
import { describe, expect, test } from 'vitest';
import { LegacyClient } from '../daemon/support/daemon-process.js';
import { LegacyLatencyProbe, newConnectionWaitMs, percentile } from '../support/legacy-latency.js';
import { PartialFrameFlood } from '../support/partial-frame-flood.js';
import { NOBODY, notRoot, onCleanup, sleep, startDaemonOpenToAll } from './support.js';

/**
 * 3,000 connections of 32 KiB each (half of the 65,535 bytes announced): 96 MiB of partial frames
 * against a 16 MiB budget. This 2-core machine opens them in under a second, and its kernel holds
 * what the helper does not read.
 */
const FLOOD = { connections: 3000, bodyBytes: 32 * 1024 };
/**
 * --frame-timeout: the default. The old daemon answered a new client only once the flood's frames
 * timed out (8 to 17.7 s with it); the flood is cut and reopened meanwhile by the evictions.
 */
const FRAME_TIMEOUT_S = 10;
const MEASURE_MS = 10_000;
const NEW_CONNECTION_EVERY_MS = 200;
/**
 * How long the test waits for each reply: far above what is expected (milliseconds; QEMU's own wait
 * is 0.5 s, which `npm run bench -- latency` measures under this flood), and half the frame timeout,
 * so a client answered only once the flood's frames timed out fails. A busy machine stays under it.
 */
const REPLY_DEADLINE_MS = (FRAME_TIMEOUT_S * 1000) / 2;

describe('a partial-frame flood', () => {
  test('a new legacy client is answered within 0.5 s while uid nobody holds 3,000 connections of half a v2 frame, reopening each when closed', async (ctx) => {
    const why = notRoot();
    if (why) return ctx.skip(why);
    const { daemon, sock } = await startDaemonOpenToAll(['--frame-timeout', String(FRAME_TIMEOUT_S)]);
    const qemu = await LegacyClient.connect(sock); // a QEMU connected before the flood
    onCleanup(() => qemu.close());
    expect(await qemu.request(0x606, 0, process.pid)).toBe(0xa1003n);
    const flood = await new PartialFrameFlood({ socketPath: sock, ...FLOOD, uid: NOBODY }).ready();
    onCleanup(() => flood.stop());
    const probe = await LegacyLatencyProbe.start(sock, 10);
    onCleanup(() => void probe.stop());
    // New QEMUs connecting all along, across several of the flood's timeout waves.
    const waits: number[] = [];
    const t0 = Date.now();
    while (Date.now() - t0 < MEASURE_MS) {
      waits.push(await newConnectionWaitMs(sock, 2 * FRAME_TIMEOUT_S * 1000));
      await sleep(NEW_CONNECTION_EVERY_MS);
    }
    const probeWaits = [...probe.stop(), probe.pendingMs()];
    const within = waits.filter((w) => w < 500).length / waits.length;
    console.log(
      `flood of ${flood.open} connections open on its side (${flood.opened} opened, ${flood.reopened} reopened): new connection to reply p50 ${percentile(waits, 50).toFixed(1)} ms, ` +
        `p90 ${percentile(waits, 90).toFixed(1)} ms, max ${Math.max(...waits).toFixed(1)} ms (${waits.length}; ${(within * 100).toFixed(0)} % within QEMU's 500 ms); ` +
        `connected client p99 ${percentile(probeWaits, 99).toFixed(1)} ms, max ${Math.max(...probeWaits).toFixed(1)} ms`,
    );
    // The flood was one: it opened its connections, the helper cut them (deadline, eviction) and it reopened them.
    expect(flood.opened).toBeGreaterThanOrEqual(FLOOD.connections);
    expect(flood.reopened).toBeGreaterThan(0);
    // Every new QEMU was answered, by reading it at once, not once the flood's frames timed out (the old daemon: 8
    // to 17.7 s, every one). The flood holds its share of the connection slots only, and what it opens past that is
    // closed at accept (measured in the whole suite's run: p50 9 ms, max 78 to 173 ms; the speed is bench's).
    const late = waits.filter((w) => !(w < REPLY_DEADLINE_MS));
    expect(late, `new clients not answered within ${REPLY_DEADLINE_MS} ms (a reply waiting for the flood's frames to time out)`).toEqual(
      [],
    );
    // QEMU's requests on its connection made before the flood: answered all along too.
    const lateProbe = probeWaits.filter((w) => !(w < REPLY_DEADLINE_MS));
    expect(lateProbe, `requests of the QEMU connected before, not answered within ${REPLY_DEADLINE_MS} ms`).toEqual([]);
    // The QEMU connected before is answered still, the flood's frames were evicted for the new clients (logged).
    expect(probe.error).toBeNull();
    expect(await qemu.request(0x606, 0, process.pid)).toBe(0xa1003n);
    expect(daemon.stderr()).toContain('"cause":"incomplete frame evicted"');
  }, 90_000);

  test('a new legacy client still gets a connection slot when uid nobody holds more connections than --max-connections', async (ctx) => {
    const why = notRoot();
    if (why) return ctx.skip(why);
    // 1,000 slots against 1,500 connections (most of them waiting unread for the budget): the flood gets
    // its share of the slots (a quarter: uid nobody is not root), the rest refused at accept.
    const maxConnections = 1000;
    const { daemon, sock } = await startDaemonOpenToAll(['--max-connections', String(maxConnections)]);
    const flood = new PartialFrameFlood({ socketPath: sock, connections: 1500, bodyBytes: FLOOD.bodyBytes, uid: NOBODY });
    onCleanup(() => flood.stop());
    await flood.ready().catch(() => {}); // it never holds all 1,500: 'ready' once it opened that many in all
    await sleep(1000);
    const waits: number[] = [];
    for (let i = 0; i < 10; i++) {
      waits.push(await newConnectionWaitMs(sock, REPLY_DEADLINE_MS));
      await sleep(NEW_CONNECTION_EVERY_MS);
    }
    console.log(
      `flood with ${flood.open} connections open on its side, ${maxConnections} slots: new connection to reply ${waits.map((w) => w.toFixed(1)).join(', ')} ms`,
    );
    // Before, each was closed at once unanswered (Infinity here): the slots were all the flood's.
    expect(
      waits.filter((w) => !Number.isFinite(w)),
      `new clients closed or not answered within ${REPLY_DEADLINE_MS} ms`,
    ).toEqual([]);
    expect(daemon.stderr()).toContain('its share of --max-connections');
  }, 90_000);
});
