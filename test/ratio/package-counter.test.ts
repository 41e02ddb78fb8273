/**
 * The package counter as host info describes it (HostPackage.counter): the engine wraps it at its own
 * range and counts in its own unit (powercap's µJ), a trace header carries the description only when
 * there is one (a trace of MSRs stays as it was), and a powercap trace replays.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { RatioEngine } from '../../src/ratio/attribution.js';
import { packageCounter } from '../../src/ratio/counter.js';
import type { HostInfo } from '../../src/model/host.js';
import { readTrace, replayFile } from '../../src/trace/reader.js';
import { headerLine, headerRecord, registerLine, sampleLine } from '../../src/trace/writer.js';
import { host, sample } from './helpers.js';

/** One package of one CPU (a thread busy all the time gets all of it) whose counter counts µJ and wraps after 999 999. */
function powercapHost(): HostInfo {
  const h = host([1]);
  h.packages[0]!.counter = { range: 1_000_000n, unitJ: 1e-6 };
  return h;
}

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-pkg-counter-'));
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

describe('package counter description', () => {
  test('is a RAPL MSR counter (2^32 counts of the ESU) when host info gives none', () => {
    expect(packageCounter({ pkg: 0, powerUnit: 0xa1003n })).toEqual({ range: 1n << 32n, unitJ: 2 ** -16 });
    expect(packageCounter({ pkg: 0, powerUnit: 0xa1003n, counter: { range: 10n, unitJ: 1e-6 } })).toEqual({ range: 10n, unitJ: 1e-6 });
  });

  test('the engine wraps a described counter at its range and counts in its unit', () => {
    const e = new RatioEngine(powercapHost());
    const vm = e.register({ pid: 10, starttime: 5, vcpus: [{ tid: 11, vpkg: 0 }] });
    e.addSample(sample(0, { 0: 999_000n }, { 10: [{ tid: 11, ticks: 0, starttime: 5, cpu: 0 }] }));
    e.addSample(sample(1, { 0: 999_500n }, { 10: [{ tid: 11, ticks: 100, starttime: 5, cpu: 0 }] }));
    // 999 500 -> 1 500 across the wrap: 2 000 µJ, all to the only thread that ran
    const r = e.addSample(sample(2, { 0: 1_500n }, { 10: [{ tid: 11, ticks: 200, starttime: 5, cpu: 0 }] }))!;
    expect(r.packages[0]!.energyJ).toBeCloseTo(0.002, 12);
    expect(e.output(vm)!.vpkgs[0]!.energyJ).toBeCloseTo(0.0025, 12);
  });

  test('a header without a counter description has no counter field, one with it has range and unit_j', () => {
    const msr = host([1]);
    expect(Object.keys((headerRecord({ host: msr }).host as { packages: object[] }).packages[0]!)).toEqual(['package', 'power_unit']);
    expect(headerLine({ host: powercapHost() })).toContain(
      '"packages":[{"package":0,"power_unit":"0xa0e03","counter":{"range":"0xf4240","unit_j":0.000001}}]',
    );
  });

  test('a powercap trace reads back its counter description and replays across the wrap', async () => {
    const file = path.join(tmp, 'powercap.jsonl');
    const h = powercapHost();
    const lines = [
      headerLine({ host: h }),
      registerLine(0n, { pid: 10, starttime: 5, vcpus: [{ tid: 11, vpkg: 0 }] }),
      sampleLine(sample(0, { 0: 999_000n }, { 10: [{ tid: 11, ticks: 0, starttime: 5, cpu: 0 }] })),
      sampleLine(sample(1, { 0: 1_500n }, { 10: [{ tid: 11, ticks: 100, starttime: 5, cpu: 0 }] })),
    ];
    fs.writeFileSync(file, lines.join(''));
    const first = (await readTrace(file).next()).value;
    expect(first).toMatchObject({
      type: 'header',
      header: { host: { packages: [{ pkg: 0, counter: { range: 1_000_000n, unitJ: 1e-6 } }] } },
    });
    const summary = await replayFile(file);
    expect(summary.vms[0]!.output.vpkgs[0]!.energyJ).toBeCloseTo(0.0025, 12);
  });

  test('a header whose counter description is not one is refused, naming the field', async () => {
    const file = path.join(tmp, 'bad.jsonl');
    fs.writeFileSync(file, headerLine({ host: powercapHost() }).replace('"unit_j":0.000001', '"unit_j":-1'));
    await expect(replayFile(file)).rejects.toThrow(/host\.packages\[0\]\.counter\.unit_j must be joules per count in \(0, 1\], got -1/);
  });

  test('a restored engine takes a powercap counter past 32 bits as it is, and the interval after it spans the gap', () => {
    const h = host([1]);
    const range = 262_143_328_850n + 1n; // a real max_energy_range_uj + 1, past 2^32
    h.packages[0]!.counter = { range, unitJ: 1e-6 };
    const t = (k: number) => ({ 10: [{ tid: 10, ticks: 100 * k }] });
    const live = new RatioEngine(h);
    const vm = live.register({ pid: 10, starttime: 1000, vcpus: [{ tid: 10, vpkg: 0 }] });
    live.addSample(sample(0, { 0: 200_000_000_000n }, t(0)));
    const restored = new RatioEngine(h);
    restored.restore(live.state());
    expect(restored.state().lastSample!.energy).toEqual([{ pkg: 0, raw: 200_000_000_000 }]);
    restored.addSample(sample(1, { 0: 200_005_000_000n }, t(1)));
    expect(restored.output(vm)!.vpkgs[0]!.energyJ).toBeCloseTo(5, 9);
    const beyond = { ...live.state(), lastSample: { tNs: 0n, energy: [{ pkg: 0, raw: Number(range) }] } };
    expect(() => new RatioEngine(h).restore(beyond)).toThrow(/counter 262143328851 is out of its range \(0\.\.262143328850\)/);
  });
});
