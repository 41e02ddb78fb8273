/**
 * A process of another user whose command line carries a real VM's `-name` and `-uuid` is
 * discovered as a VM of that name and UUID. Its series differed from the real VM's in `pid` only,
 * so `sum by (name, uuid)`, a README query, added its energy to the real VM's. The real daemon
 * and exporter, a real Prometheus, a victim VM process of this test's uid and a fake of uid nobody,
 * both spinning.
 */
import { describe, expect, test } from 'vitest';
import { METRIC } from '../../src/exporter/metrics.js';
import { hostArgs, startHelper } from '../daemon/support/daemon-process.js';
import { readmeQueries, startPrometheus } from '../exporter/support/stack.js';
import { missing } from '../support/env.js';
import { FakeQemu } from '../support/fake-qemu.js';
import { pollFor } from '../support/wait.js';
import { fakeHost, NOBODY, notRoot, onCleanup, startExporterProcess, track } from './support.js';

const UUID = '6f1c1a7e-0000-4000-8000-00000000fa4e';
/** Energy each 20 ms on the fake package: about 50 W at 61 µJ a unit. */
const UNITS_PER_TICK = 16_384;

type Row = { metric: Record<string, string>; value: [number, string] };

/** A PromQL instant query evaluated at `time` (seconds), so that several queries see the same data. */
async function queryAt(promUrl: string, q: string, time: number): Promise<Row[]> {
  const r = await fetch(`${promUrl}/api/v1/query?query=${encodeURIComponent(q)}&time=${time}`);
  const j = (await r.json()) as { status: string; error?: string; data: { result: Row[] } };
  if (j.status !== 'success') throw new Error(`prometheus query ${q}: ${j.error}`);
  return j.data.result;
}

/** A README query restricted to the VMs named `name` (other VMs on this host are discovered too). */
function onlyNamed(query: string, name: string): string {
  const out = query.replaceAll(`${METRIC.vmEnergy}{`, `${METRIC.vmEnergy}{name="${name}",`);
  if (out === query) throw new Error(`the README query does not read ${METRIC.vmEnergy}{...}: ${query}`);
  return out;
}

describe("a fake wearing a real VM's name", () => {
  test("has series of its own uid, and the README queries do not add its energy to the real VM's", async (ctx) => {
    const why = notRoot() ?? missing({ command: 'prometheus' });
    if (why) return ctx.skip(`${why} (the README queries run in a real Prometheus)`);
    const { host, sock } = fakeHost();
    onCleanup(host.pumpEnergy({ units: UNITS_PER_TICK, everyMs: 20 }));
    const daemon = track(await startHelper(['-k', sock, ...hostArgs(host), '--interval', '0.25']));
    const name = `twin-${process.pid}-${Date.now() % 100_000}`;
    const args = ['-name', `guest=${name}`, '-uuid', UUID, '-smp', '1'];
    const victim = await new FakeQemu({ vcpus: 1, args }).ready();
    onCleanup(() => victim.kill());
    const fake = await new FakeQemu({ vcpus: 1, args }, { uid: NOBODY, gid: NOBODY }).ready();
    onCleanup(() => fake.kill());
    await victim.cmd('spin 0');
    await fake.cmd('spin 0');
    const exporter = await startExporterProcess(sock);
    const prom = await startPrometheus(new URL(exporter.url).host);
    onCleanup(() => prom.stop());
    const logs = () => `--- prometheus:\n${prom.log()}\n--- exporter:\n${exporter.child.stderr()}\n--- daemon:\n${daemon.stderr()}`;
    const me = String(process.getuid!());

    // Both are VMs of that name and UUID, told apart by pid and by their owner's uid.
    const info = await pollFor(
      async () => {
        const r = await prom.query(`${METRIC.vmInfo}{name="${name}"}`);
        return r.length === 2 ? r : undefined;
      },
      'both VMs in Prometheus',
      logs,
      60_000,
    );
    expect(info.map((r) => [r.metric.pid, r.metric.uid, r.metric.uuid, r.metric.source]).sort()).toEqual(
      [
        [String(victim.pid), me, UUID, 'discovered'],
        [String(fake.pid), String(NOBODY), UUID, 'discovered'],
      ].sort(),
    );

    // The README's per-VM queries, as printed but for a matcher on the name, give the fake a row of
    // its own: the real VM's row is its own energy, nothing of the fake's.
    const vmQueries = readmeQueries().filter((q) => q.includes(METRIC.vmEnergy));
    expect(vmQueries).toHaveLength(2);
    const [perVm, top10] = vmQueries.map((q) => onlyNamed(q, name));
    await pollFor(
      async () => ((await prom.query(`${perVm!} > 0`)).length === 2 ? true : undefined),
      'power for both VMs (two scrapes with energy)',
      logs,
      60_000,
    );
    const at = Date.now() / 1000;
    const victimOnly = `sum(increase(${METRIC.vmEnergy}{pid="${victim.pid}"}[1d]))`;
    const [rows, own, unsafe, perVmRows] = await Promise.all([
      queryAt(prom.url, top10!, at),
      queryAt(prom.url, victimOnly, at),
      queryAt(prom.url, `sum by (name, uuid) (increase(${METRIC.vmEnergy}{name="${name}"}[1d]))`, at),
      queryAt(prom.url, perVm!, at),
    ]);
    const byUid = new Map(rows.map((r) => [r.metric.uid, Number(r.value[1])]));
    expect([...byUid.keys()].sort()).toEqual([me, String(NOBODY)].sort());
    expect(byUid.get(me)! * 3.6e6).toBeCloseTo(Number(own[0]!.value[1]), 3);
    expect(byUid.get(String(NOBODY))!).toBeGreaterThan(0);
    // What the query without uid did: one row, the fake's energy added to the real VM's.
    expect(unsafe).toHaveLength(1);
    expect(Number(unsafe[0]!.value[1])).toBeGreaterThan(Number(own[0]!.value[1]));
    expect(perVmRows.map((r) => [r.metric.pid, r.metric.uid]).sort()).toEqual(
      [
        [String(victim.pid), me],
        [String(fake.pid), String(NOBODY)],
      ].sort(),
    );
  });
});
