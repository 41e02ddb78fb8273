/**
 * A local user starts hundreds of short-lived processes named like QEMU a second: discovery looks at
 * each, admits it, samples it, sees it end. That work once ran in one synchronous block per interval
 * (a /proc scan and a sample of every VM), and QEMU's legacy requests waited behind it for hundreds
 * of ms; QEMU divides the energy of its stretched window by one second of ticks, so its guest read
 * more energy than it used. Now scans and samples run in slices with clients served between them.
 */
import path from 'node:path';
import { describe, expect, test } from 'vitest';
import { V2Client } from '../../src/client/v2-client.js';
import { hostArgs, startHelper } from '../daemon/support/daemon-process.js';
import { LegacyLatencyProbe, percentile } from '../support/legacy-latency.js';
import { ProcessStorm } from '../support/process-storm.js';
import { fakeHost, NOBODY, notRoot, onCleanup, sleep, track } from './support.js';

/** The storm: 200 processes a second, each living 0.5 s with 2 threads named `CPU n/KVM` (about 100 alive at once). */
const STORM = { perSecond: 200, lifeMs: 500, vcpus: 2 };
const WARMUP_MS = 3000;
const MEASURE_MS = 10_000;
/**
 * The bound on the legacy p99 during the storm: 50 ms, or, on a machine so busy that the daemon with
 * discovery off (measured at the same moments, beside it) already waits long, 1.5 times that p99 plus
 * 50 ms. Before the fix, one synchronous block per interval (the scan and the sample) put the p99 at
 * hundreds of ms above the anchor (85 ms against 8.5 on a lightly loaded run of this 2-core machine,
 * 1,009 ms against 621 on one shared by 8 test runs); after, it stays within a few ms of the
 * anchor's, and tens of ms on that shared machine. The margin is for that sharing: both daemons wait
 * for the CPU alike, only the daemon's own blocking separates them.
 */
const P99_FLOOR_MS = 50;

describe('a discovery storm', () => {
  test('legacy requests are answered within ms at p99 while uid nobody starts 200 short-lived fake QEMUs a second', async (ctx) => {
    const why = notRoot();
    if (why) return ctx.skip(why);
    const { host, dir, sock } = fakeHost();
    const anchorSock = path.join(dir, 'anchor.sock');
    // Both daemons at once, so that both see the same machine load: the anchor has discovery off.
    track(await startHelper(['-k', sock, '-u', 'nobody', ...hostArgs(host)]));
    track(await startHelper(['-k', anchorSock, '-u', 'nobody', '--no-discovery', ...hostArgs(host)]));
    const storm = await new ProcessStorm({ ...STORM, uid: NOBODY }).ready();
    onCleanup(() => storm.stop());
    const probe = await LegacyLatencyProbe.start(sock, 10);
    const anchor = await LegacyLatencyProbe.start(anchorSock, 10);
    onCleanup(() => {
      probe.stop();
      anchor.stop();
    });
    await sleep(WARMUP_MS);
    const startedBefore = storm.started;
    probe.reset();
    anchor.reset();
    await sleep(MEASURE_MS);
    const waits = [...probe.stop(), probe.pendingMs()];
    const anchorWaits = [...anchor.stop(), anchor.pendingMs()];
    const rate = (storm.started - startedBefore) / (MEASURE_MS / 1000);
    // Discovery did look at the storm: fake VMs of uid nobody are listed (alive or just ended).
    const c = await V2Client.connect(sock);
    onCleanup(() => c.close());
    expect((await c.list()).length).toBeGreaterThan(0);
    expect(probe.error).toBeNull();
    expect(anchor.error).toBeNull();
    const p99 = percentile(waits, 99);
    const anchorP99 = percentile(anchorWaits, 99);
    const bound = Math.max(P99_FLOOR_MS, 1.5 * anchorP99 + 50);
    console.log(
      `storm of ${rate.toFixed(0)} processes/s: legacy p50 ${percentile(waits, 50).toFixed(2)} ms, p99 ${p99.toFixed(1)} ms, ` +
        `max ${Math.max(...waits).toFixed(1)} ms (${waits.length} requests); discovery off: p99 ${anchorP99.toFixed(1)} ms, ` +
        `max ${Math.max(...anchorWaits).toFixed(1)} ms; bound ${bound.toFixed(1)} ms`,
    );
    // The storm ran (a busy machine starts fewer than asked, but it must be a storm).
    expect(rate).toBeGreaterThan(STORM.perSecond / 4);
    expect(p99).toBeLessThan(bound);
  }, 60_000);
});
