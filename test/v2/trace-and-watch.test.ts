import fs from 'node:fs';
import path from 'node:path';
import { execFile } from 'node:child_process';
import { BIN, ensureBuilt } from '../daemon/support/daemon-process.js';
import { afterEach, describe, expect, it } from 'vitest';
import { V2Client, type Update } from '../../src/client/v2-client.js';
import { TraceWriter } from '../../src/trace/writer.js';
import { replayFile } from '../../src/trace/replay-file.js';
import { formatUpdate, runWatch } from '../../src/cli/commands/watch.js';
import { startChild, startHarness, until } from './harness.js';

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

describe('trace recording by the v2 service', () => {
  it('a live run replays to the same published numbers', async () => {
    const tmp = fs.mkdtempSync('/tmp/vmsr-v2trace-');
    cleanups.push(() => fs.rmSync(tmp, { recursive: true, force: true }));
    const tracePath = path.join(tmp, 'live.jsonl');
    let trace: TraceWriter | undefined;
    // The header needs the host; the harness reads it, so open the trace lazily through a proxy sink.
    const sink = {
      register: (t: bigint, vm: Parameters<TraceWriter['register']>[1]) => trace!.register(t, vm),
      sample: (s: Parameters<TraceWriter['sample']>[0]) => trace!.sample(s),
      unregister: (t: bigint, pid: number) => trace!.unregister(t, pid),
    };
    const h = await startHarness({ intervalMs: 25, trace: sink });
    cleanups.push(() => h.close());
    trace = TraceWriter.open(tracePath, { host: h.host, note: 'v2 service test' });
    const spin = startChild('spin');
    const sleep = startChild('sleep');
    cleanups.push(() => spin.kill(), () => sleep.kill());
    const pump = setInterval(() => h.addEnergy(30000), 5);
    cleanups.push(() => clearInterval(pump));

    const c = await V2Client.connect(h.socketPath);
    cleanups.push(() => c.close());
    const a = await c.register({ pid: spin.pid, vcpus: [{ tid: spin.pid, vpkg: 0 }] });
    const b = await c.register({ pid: sleep.pid, vcpus: [{ tid: sleep.pid, vpkg: 0 }] });
    const ua: Update[] = [];
    await c.subscribe(a.vmId, (u) => ua.push(u));
    await until(() => ua.length >= 12, 8000, 'updates');
    await sleep.kill(); // b ends (frozen) during the run
    await until(() => ua.length >= 18, 8000, 'more updates');
    // READs and UNREGISTERs written together: the helper handles them in one go, no sample between.
    const [va, vb] = await Promise.all([c.read(a.vmId, 0), c.read(b.vmId, 0), c.unregister(a.vmId), c.unregister(b.vmId)]);
    await trace.close();

    const summary = await replayFile(tracePath);
    const [ra, rb] = summary.vms.map((v) => v.output);
    expect(ra!.pid).toBe(spin.pid);
    expect(rb!.pid).toBe(sleep.pid);
    expect(ra!.ended && rb!.ended).toBe(true);
    // READ happened after the last sample before unregister: the replay's totals are those values.
    expect(ra!.vpkgs[0]!.energyUj).toBe(va!.energyUj);
    expect(BigInt(ra!.vpkgs[0]!.counter)).toBe(va!.counter);
    expect(rb!.vpkgs[0]!.energyUj).toBe(vb!.energyUj);
    expect(va!.energyUj).toBeGreaterThan(vb!.energyUj);
    expect(va!.energyUj).toBeGreaterThan(0n);
  });
});

describe('watch', () => {
  it('formats power from the energy delta over the time delta', () => {
    const a: Update = { vmId: 1, tNs: 1_000_000_000n, vpkgs: [{ counter: 0n, energyUj: 1_000_000n }], ended: false };
    const b: Update = { vmId: 1, tNs: 3_000_000_000n, vpkgs: [{ counter: 0n, energyUj: 21_000_000n }], ended: true };
    expect(formatUpdate(a, b)).toMatch(/vpkg0 +10\.00 W +21\.000 J.*ended/);
    expect(formatUpdate(null, a)).toMatch(/vpkg0 +- +1\.000 J/);
    // Time counts from the first sample watched, not the helper's monotonic clock; t_ns 0 is "-".
    expect(formatUpdate(a, b, a.tNs)).toMatch(/^t= +2\.0s /);
    expect(formatUpdate(null, { ...a, tNs: 0n }, undefined)).toMatch(/^t= +- /);
  });

  it('runWatch registers, prints updates, stops after --count and unregisters', async () => {
    const h = await startHarness({ intervalMs: 20 });
    cleanups.push(() => h.close());
    const spin = startChild('spin');
    cleanups.push(() => spin.kill());
    const pump = setInterval(() => h.addEnergy(10000), 5);
    cleanups.push(() => clearInterval(pump));
    const lines: string[] = [];
    await runWatch({ socket: h.socketPath, pid: spin.pid, vcpus: [{ tid: spin.pid, vpkg: 0 }], count: 5 }, (l) => lines.push(l));
    expect(lines[0]).toMatch(/registered as vm \d+ with 1 virtual package/);
    expect(lines.filter((l) => l.startsWith('t=')).length).toBeGreaterThanOrEqual(6);
    expect(lines.at(-1)).toMatch(/ W /);
    await until(() => h.service.vms === 0 && h.service.connections === 0, 3000, 'watch cleaned up');
  });

  it('runWatch given an already aborted signal (Ctrl-C during start-up) still returns and unregisters', async () => {
    const h = await startHarness({ intervalMs: 20 });
    cleanups.push(() => h.close());
    const ac = new AbortController();
    ac.abort();
    const lines: string[] = [];
    await runWatch({ socket: h.socketPath, pid: process.pid, vcpus: [{ tid: process.pid, vpkg: 0 }] }, (l) => lines.push(l), ac.signal);
    expect(lines[0]).toMatch(/registered as vm \d+/);
    await until(() => h.service.vms === 0 && h.service.connections === 0, 3000, 'watch cleaned up');
  });

  function watchCli(args: string[]): Promise<{ code: number | null; stderr: string }> {
    ensureBuilt();
    return new Promise((resolve) =>
      execFile(process.execPath, [BIN, 'watch', ...args], (err, _o, stderr) => resolve({ code: err ? (err as { code?: number }).code ?? 1 : 0, stderr })),
    );
  }

  it('the CLI says how to start the helper when nothing listens', async () => {
    const r = await watchCli(['-k', '/tmp/vmsr-no-such.sock', '--pid', String(process.pid), '--vcpus', `${process.pid}:0`]);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/no helper is listening at \/tmp\/vmsr-no-such.sock.*start it with: vmsr-helper -k/);
  });

  it('the CLI refuses --vcpus beside --qmp instead of ignoring it', async () => {
    const r = await watchCli(['-k', '/tmp/vmsr-no-such.sock', '--qmp', '/tmp/vmsr-no-such.qmp', '--vcpus', `${process.pid}:0`]);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/--vcpus goes with --pid, not --qmp/);
  });
});
