/**
 * 100 processes of another user, each claiming `-smp sockets=256` with one thread named
 * `CPU 255/KVM`, used to make 256 virtual packages each (257 series a VM in the exporter), and one
 * sample's burst of UPDATEs went over `--max-backlog`, so the daemon dropped its observers every
 * second as clients that do not read. Run against the real daemon, the real exporter and a v2
 * observer that reads each sample as it comes; the fakes are real processes of uid nobody.
 */
import fs from 'node:fs';
import { describe, expect, test } from 'vitest';
import { V2Client } from '../../src/client/v2-client.js';
import { type VmUpdate } from '../../src/client/v2-replies.js';
import { METRIC } from '../../src/exporter/metrics.js';
import { hostArgs, startHelper } from '../daemon/support/daemon-process.js';
import { FakeQemuFarm } from '../support/fake-qemu.js';
import { waitFor } from '../support/wait.js';
import { fakeHost, NOBODY, notRoot, onCleanup, sleep, startExporterProcess, track } from './support.js';

const FAKES = 100;
const SOCKETS = 256;
const INTERVAL_S = 0.25;
/** The exporter's RSS beside the fakes stays under this (the attack took it to 120 MB). */
const EXPORTER_RSS_MAX_MB = 100;
/** Samples watched once every fake is listed: 5 s at 0.25 s. */
const WATCHED_SAMPLES = 20;

/** VMs of the burst test, and the --max-backlog a quarter of their one sample's UPDATEs (10 x 4120 bytes). */
const BURST_VMS = 10;
const BURST_BACKLOG = 10 * 1024;

/** Series lines of `body` whose name is `metric` and whose labels hold `pid="PID"`, by label text. */
function seriesOf(body: string, metric: string, pid: number): string[] {
  return body.split('\n').filter((l) => l.startsWith(`${metric}{`) && l.includes(`,pid="${pid}",`));
}

/** A counter or gauge without labels from an exposition, or undefined. */
function valueOf(body: string, metric: string): number | undefined {
  const line = body.split('\n').find((l) => l.startsWith(`${metric} `));
  return line === undefined ? undefined : Number(line.slice(metric.length + 1));
}

describe('fakes with 256 virtual packages', () => {
  test('the exporter and a reading observer stay connected beside 100 fakes of 256 packages, each of which has one virtual package', async (ctx) => {
    const why = notRoot();
    if (why) return ctx.skip(why);
    const { host, sock } = fakeHost();
    const daemon = track(await startHelper(['-k', sock, ...hostArgs(host), '--interval', String(INTERVAL_S)]));
    const farm = new FakeQemuFarm(FAKES, 1, {
      firstVcpu: SOCKETS - 1,
      args: ['-name', 'guest=wide', '-smp', `${SOCKETS},sockets=${SOCKETS}`],
      uid: NOBODY,
    });
    onCleanup(() => farm.kill());
    const fakes = await farm.ready();
    const exporter = await startExporterProcess(sock);

    // Every fake is discovered, with one virtual package (its one thread's socket), owned by nobody.
    const observer = await V2Client.connect(sock).catch((e: Error) => {
      throw new Error(`${e.message}\n${daemon.stderr()}`);
    });
    onCleanup(() => observer.close());
    const mine = new Set(fakes);
    let listed: Awaited<ReturnType<V2Client['list']>> = [];
    const until = Date.now() + 30_000;
    const listAll = () =>
      observer.list().catch((e: Error) => {
        throw new Error(`${e.message}\n${daemon.stderr()}`);
      });
    while ((listed = (await listAll()).filter((v) => mine.has(v.pid))).length < FAKES) {
      if (Date.now() > until) throw new Error(`only ${listed.length} of ${FAKES} fakes discovered\n${daemon.stderr()}`);
      await sleep(200);
    }
    expect(listed.map((v) => [v.nvpkg, v.uid, v.source])).toEqual(Array.from({ length: FAKES }, () => [1, NOBODY, 'discovered']));

    // A client that reads each sample as it comes: every fake observed, and the host.
    const updates = new Map<number, number>();
    let hostUpdates = 0;
    const count = (u: VmUpdate) => updates.set(u.hostVmId, (updates.get(u.hostVmId) ?? 0) + 1);
    await Promise.all(listed.map((v) => observer.observe(v.hostVmId, count)));
    await observer.subscribeHost(() => hostUpdates++);
    let closed = false;
    void observer.closed.then(() => (closed = true));
    const hostBefore = hostUpdates;
    await waitFor(
      () => hostUpdates >= hostBefore + WATCHED_SAMPLES || closed,
      `${WATCHED_SAMPLES} samples to the observer`,
      daemon,
      60_000,
    );
    expect(closed).toBe(false);
    expect(Math.min(...listed.map((v) => updates.get(v.hostVmId) ?? 0))).toBeGreaterThanOrEqual(WATCHED_SAMPLES);

    // The exporter has each fake's series for its one virtual package, power included, and never reconnected.
    let body = '';
    const untilSeries = Date.now() + 30_000;
    for (;;) {
      body = await (await fetch(exporter.url)).text();
      if (fakes.every((pid) => seriesOf(body, METRIC.vmPower, pid).length === 1)) break;
      if (Date.now() > untilSeries) throw new Error(`the exporter has no power series for every fake\n${exporter.child.stderr()}`);
      await sleep(250);
    }
    for (const pid of fakes) {
      expect(seriesOf(body, METRIC.vmEnergy, pid).map((l) => /,vpkg="(\d+)"/.exec(l)?.[1])).toEqual(['0']);
      expect(seriesOf(body, METRIC.vmInfo, pid)).toHaveLength(1);
    }
    // The attack grew the exporter from 60 to 120 MB; with one virtual package a fake it stays near
    // its start (61 MB here; the margin is for another Node version's heap, not for load).
    const rssMb = Number(/VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${exporter.child.proc.pid}/status`, 'utf8'))![1]) / 1024;
    console.log(`exporter RSS ${rssMb.toFixed(0)} MB beside ${FAKES} fakes`);
    expect(rssMb).toBeLessThan(EXPORTER_RSS_MAX_MB);
    expect(valueOf(body, METRIC.up)).toBe(1);
    expect(valueOf(body, METRIC.connects)).toBe(1);
    expect(closed).toBe(false);
    expect(daemon.stderr()).not.toContain('does not read its socket');
  });

  test("a client that reads each sample stays connected when one sample's burst is four times --max-backlog", async () => {
    const { host, sock } = fakeHost();
    const daemon = track(
      await startHelper([
        '-k',
        sock,
        ...hostArgs(host),
        '--interval',
        String(INTERVAL_S),
        '--no-discovery',
        '--max-backlog',
        String(BURST_BACKLOG),
      ]),
    );
    const farm = new FakeQemuFarm(BURST_VMS, 1);
    onCleanup(() => farm.kill());
    const pids = await farm.ready();
    const c = await V2Client.connect(sock);
    onCleanup(() => c.close());
    // Each VM's one vCPU in virtual package 255 (a registrant names its own VM's layout): UPDATEs of
    // 24 + 16 x 256 bytes, 40 KiB a sample for the ten.
    const updates = new Map<number, number>();
    for (const pid of pids) {
      const tid = Number(fs.readdirSync(`/proc/${pid}/task`).find((t) => Number(t) !== pid));
      const r = await c.register({ pid, vcpus: [{ tid, vpkg: 255 }] });
      expect(r.nvpkg).toBe(256);
      await c.subscribe(r.vmId, () => updates.set(r.vmId, (updates.get(r.vmId) ?? 0) + 1));
    }
    let samples = 0;
    let closed = false;
    void c.closed.then(() => (closed = true));
    await c.subscribeHost(() => samples++);
    await waitFor(() => samples >= WATCHED_SAMPLES || closed, `${WATCHED_SAMPLES} samples`, daemon, 60_000);
    expect(closed).toBe(false);
    expect([...updates.values()].every((n) => n >= WATCHED_SAMPLES - 1)).toBe(true);
    expect(updates.size).toBe(BURST_VMS);
    expect(daemon.stderr()).not.toContain('does not read its socket');
  });
});
