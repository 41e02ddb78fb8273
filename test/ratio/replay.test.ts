/** Replay bookkeeping around the engine: unregister by pid, problems, attributed time, table text. */
import { describe, expect, it } from 'vitest';
import { RatioEngine } from '../../src/ratio/attribution.js';
import { KEPT_PROBLEMS, Replay, replayRecords } from '../../src/ratio/trace-replay.js';
import { formatProblems, formatTable, intervalJsonLine, totalJsonLine } from '../../src/ratio/replay-report.js';
import type { TraceRecord } from '../../src/ratio/trace-records.js';
import type { IntervalResult } from '../../src/ratio/outputs.js';
import { host, sample, units } from './helpers.js';

const header: TraceRecord = { type: 'header', line: 1, header: { host: host(), note: 'unit' } };
const reg = (line: number, pid: number, name: string): TraceRecord => ({
  type: 'register',
  line,
  tNs: 0n,
  vm: { pid, starttime: 1000, name, vcpus: [{ tid: pid + 1, vpkg: 0 }] },
});
const smp = (line: number, sec: number, joules: number, tasks: Record<number, { tid: number; ticks: number }[]>): TraceRecord => ({
  type: 'sample',
  line,
  sample: sample(sec, { 0: units(joules) }, tasks),
});

describe('replay', () => {
  it('unregister ends the oldest live registration of the pid; a stray one is a reported problem', async () => {
    const intervals: IntervalResult[] = [];
    const s = await replayRecords(
      [
        header,
        reg(2, 100, 'first'),
        reg(3, 100, 'second'),
        smp(4, 1, 0, { 100: [{ tid: 101, ticks: 0 }] }),
        // Both registrations see the same 50 ticks: 100 ticks on a 200-tick package, 25 J each.
        smp(5, 2, 100, { 100: [{ tid: 101, ticks: 50 }] }),
        { type: 'unregister', line: 6, tNs: 2_000_000_000n, pid: 100 },
        { type: 'unregister', line: 7, tNs: 2_000_000_000n, pid: 777 },
        smp(8, 3, 200, { 100: [{ tid: 101, ticks: 100 }] }),
      ],
      (r) => intervals.push(r),
    );
    expect(intervals.map((r) => r.vms.map((v) => v.vpkgEnergyJ[0]))).toEqual([[25, 25], [25]]);
    expect(s.vms.map((v) => [v.output.name, v.output.ended, v.attributedS])).toEqual([
      ['first', true, 1],
      ['second', false, 2],
    ]);
    expect(s.problems).toEqual({ count: 1, first: ['line 7: unregister of pid 777, which is not registered: ignored'] });
    expect(formatProblems(s)).toMatch(/^1 problem\(s\)/);
    const table = formatTable(s);
    // Unregistered by its client (the trace's unregister), not ended by its process.
    expect(table).toMatch(/first\s+100\s+unregistered\s+0\s+25\.000\s+25\.00\s+1\.0/);
    expect(table).toMatch(/second\s+100\s+running\s+0\s+50\.000\s+25\.00\s+2\.0/);
  });

  it('refuses a trace that registers more VMs than it may hold, naming the line', () => {
    const r = new Replay((header as Extract<TraceRecord, { type: 'header' }>).header, 3);
    for (let i = 0; i < 3; i++) r.apply(reg(i + 2, 100 + 10 * i, `vm${i}`) as Extract<TraceRecord, { type: 'register' }>);
    expect(() => r.apply(reg(5, 200, 'one too many') as Extract<TraceRecord, { type: 'register' }>)).toThrow(/line 5.*more than 3 VMs/);
    expect(r.summary().vms).toHaveLength(3);
    // By default, as many as a daemon holds.
    const d = new Replay((header as Extract<TraceRecord, { type: 'header' }>).header);
    for (let i = 0; i < 100_000; i++) d.apply(reg(2, 1000 + i, 'vm') as Extract<TraceRecord, { type: 'register' }>);
    expect(() => d.apply(reg(3, 5, 'past') as Extract<TraceRecord, { type: 'register' }>)).toThrow(/line 3.*more than 100000 VMs/);
  });

  it('keeps only the first problems but counts them all', async () => {
    const recs: TraceRecord[] = [header];
    for (let i = 0; i < 30; i++) recs.push({ type: 'unregister', line: i + 2, tNs: 0n, pid: 5 });
    const s = await replayRecords(recs);
    expect(s.problems.count).toBe(30);
    expect(s.problems.first).toHaveLength(KEPT_PROBLEMS);
    expect(formatProblems(s)).toMatch(/^30 problem\(s\) .*; the first 10:/);
  });

  it('JSON lines: t_ns past 2^53 is written exactly; names come out as given (null when unnamed)', () => {
    const line = intervalJsonLine({ tNs: 2n ** 60n + 1n, dtS: 1, packages: [], vms: [], ended: [], problems: [] });
    expect(line).toBe(`{"type":"interval","t_ns":${2n ** 60n + 1n},"dt_s":1,"packages":[],"vms":[]}`);
    const e = new RatioEngine(host());
    e.register({ pid: 3, starttime: 1, vcpus: [{ tid: 4, vpkg: 1 }] });
    expect(JSON.parse(totalJsonLine(e.outputs()))).toEqual({
      type: 'total',
      vms: [
        {
          pid: 3,
          name: null,
          ended: false,
          vpkgs: [
            { vpkg: 0, energy_uj: '0', counter: '0x0' },
            { vpkg: 1, energy_uj: '0', counter: '0x0' },
          ],
        },
      ],
    });
  });

  it('the table neutralises control characters in names from the trace', async () => {
    const s = await replayRecords([header, reg(2, 100, 'evil\u001b[2J')]);
    expect(formatTable(s)).not.toMatch(/\u001b/);
  });

  it('u_guest is the unit of package 0, or of the lowest package when there is no 0', () => {
    const h = host([1, 1]);
    h.packages = [
      { pkg: 1, powerUnit: 0xa1003n },
      { pkg: 0, powerUnit: 0xa0e03n },
    ];
    expect(new RatioEngine(h).guestPowerUnit).toBe(0xa0e03n);
    h.packages = [
      { pkg: 3, powerUnit: 0xa1003n },
      { pkg: 2, powerUnit: 0xa0f03n },
    ];
    h.cpus = [
      { cpu: 0, pkg: 2 },
      { cpu: 1, pkg: 3 },
    ];
    expect(new RatioEngine(h).guestPowerUnit).toBe(0xa0f03n);
  });
});
