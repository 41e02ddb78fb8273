/**
 * The engine's other RAPL domains (docs/ratio.md, "Other RAPL domains"): core, uncore and DRAM shared
 * within their package like the package, PSYS across every package's VMs, a missing value spanned by
 * the next, wraps, and the state a restart carries.
 */
import { describe, expect, test } from 'vitest';
import { RatioEngine } from '../../src/ratio/attribution.js';
import type { DomainCounter, HostInfo } from '../../src/model/host.js';
import type { Sample } from '../../src/model/sample.js';
import { emptyVmTotals, type VmOutput } from '../../src/ratio/outputs.js';
import { host, sample, units, type ThreadAt } from './helpers.js';

const UJ = 1e-6;
const WRAP = 1n << 32n;

/** `host(...)` with the given other-domain counters (µJ units, powercap-like, unless a unit is given). */
function hostWith(cpusPerPackage: number[], domains: Omit<DomainCounter, 'range' | 'unitJ'>[], range = WRAP, unitJ = UJ): HostInfo {
  return { ...host(cpusPerPackage), domains: domains.map((d) => ({ ...d, range, unitJ })) };
}

/** A sample with package counters and other-domain raw values, keyed "domain pkg". */
function sampleWith(
  seconds: number,
  energy: Record<number, bigint>,
  domains: Record<string, bigint>,
  tasks: Record<number, ThreadAt[]>,
): Sample {
  const s = sample(seconds, energy, tasks);
  s.domains = Object.entries(domains).map(([k, raw]) => {
    const [domain, pkg] = k.split(' ');
    return { domain: domain as DomainCounter['domain'], pkg: Number(pkg), raw };
  });
  return s;
}

function domainJ(out: VmOutput | undefined, domain: string): number[] {
  return out?.domains?.find((d) => d.domain === domain)?.vpkgEnergyJ ?? [];
}

const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);

/** VM pid 10 with vCPU thread 11 in virtual package 0 and 12 in virtual package 1. */
const twoSocketVm = (e: RatioEngine) =>
  e.register({
    pid: 10,
    starttime: 1000,
    vcpus: [
      { tid: 11, vpkg: 0 },
      { tid: 12, vpkg: 1 },
    ],
  });

describe('RatioEngine with other RAPL domains', () => {
  test("totalsInto gives a VM's output and thread totals in the caller's object, reusing its arrays from one sample to the next", () => {
    const e = new RatioEngine(
      hostWith(
        [2, 2],
        [
          { domain: 'dram', pkg: 0 },
          { domain: 'psys', pkg: 0 },
        ],
      ),
    );
    const vm = twoSocketVm(e);
    const threads = (t: number) => ({
      10: [
        { tid: 10, ticks: 5 * t },
        { tid: 11, ticks: 60 * t, cpu: 0 },
        { tid: 12, ticks: 30 * t, cpu: 2 },
      ],
    });
    const into = emptyVmTotals();
    expect(e.totalsInto(99, into)).toBe(false);
    let arrays: unknown[] = [];
    for (let t = 0; t < 4; t++) {
      e.addSample(
        sampleWith(
          t,
          { 0: units(100 * t), 1: units(50 * t) },
          { 'dram 0': BigInt(1_000_000 + 7_777_777 * t), 'psys 0': BigInt(9_999_999 * t) },
          threads(t),
        ),
      );
      expect(e.totalsInto(vm, into)).toBe(true);
      const out = e.output(vm)!;
      const tt = e.threadTotals(vm)!;
      expect(into).toEqual({
        vmId: vm,
        changes: expect.any(Number),
        tNs: out.tNs,
        ended: out.ended,
        energyUj: out.vpkgs.map((v) => Number(v.energyUj)),
        counter: out.vpkgs.map((v) => v.counter),
        domains: out.domains!.map((d) => ({ domain: d.domain, energyUj: d.vpkgEnergyUj.map(Number) })),
        vcpus: tt.vcpus.map((v) => ({ tid: v.tid, energyJ: v.energyJ, ticks: v.ticks })),
        otherTicks: tt.otherTicks,
      });
      const now = [into.energyUj, into.counter, into.vcpus, into.domains, ...into.vcpus, ...into.domains];
      if (t > 1) expect(now.every((a, i) => a === arrays[i])).toBe(true);
      arrays = now;
    }
    expect(into.energyUj[0]).toBeGreaterThan(0);
    expect(into.vcpus[0]!.ticks).toBeGreaterThan(0);
    // An idle interval (no line changed): only the sample time is set, the rest is what the object holds.
    const energy = into.energyUj[0]!;
    into.energyUj[0] = -1;
    e.addSample(sampleWith(4, { 0: units(500), 1: units(250) }, { 'dram 0': 99_000_000n, 'psys 0': 99_000_000n }, threads(3)));
    e.totalsInto(vm, into);
    expect([into.tNs, into.energyUj[0]]).toEqual([4_000_000_000n, -1]);
    // A line that changed with no tick (the thread ran on another CPU): the same.
    const moved = threads(3);
    moved[10][1]!.cpu = 1;
    e.addSample(sampleWith(5, { 0: units(600), 1: units(300) }, { 'dram 0': 109_000_000n, 'psys 0': 109_000_000n }, moved));
    e.totalsInto(vm, into);
    expect([into.tNs, into.energyUj[0]]).toEqual([5_000_000_000n, -1]);
    // Anything else that changes them (a new vCPU list, a VM ended) fills them again.
    e.updateVcpus(vm, [{ tid: 11, vpkg: 0 }]);
    e.totalsInto(vm, into);
    expect([into.energyUj[0], into.vcpus.length]).toEqual([energy, 1]);
    into.energyUj[0] = -1;
    e.unregister(vm);
    e.totalsInto(vm, into);
    expect([into.energyUj[0], into.ended]).toEqual([energy, true]);
  });

  test('a package-scoped domain is shared by the same CPU-time fractions as the package, with its own energy and books', () => {
    const e = new RatioEngine(hostWith([2], [{ domain: 'dram', pkg: 0 }]));
    const a = e.register({ pid: 10, starttime: 1000, vcpus: [{ tid: 11, vpkg: 0 }] });
    const b = e.register({ pid: 20, starttime: 1000, vcpus: [{ tid: 21, vpkg: 0 }] });
    const threads = (t: number) => ({
      10: [
        { tid: 10, ticks: 0 },
        { tid: 11, ticks: 60 * t },
      ],
      20: [
        { tid: 20, ticks: 0 },
        { tid: 21, ticks: 20 * t },
      ],
    });
    e.addSample(sampleWith(0, { 0: units(0) }, { 'dram 0': 1_000_000n }, threads(0)));
    const r = e.addSample(sampleWith(1, { 0: units(100) }, { 'dram 0': 31_000_000n }, threads(1)))!;
    // cap = 100 ticks/s x 2 CPUs: VM a ran 60, VM b 20 of 200.
    expect(domainJ(e.output(a), 'dram')[0]).toBeCloseTo(30 * (60 / 200), 9);
    expect(domainJ(e.output(b), 'dram')[0]).toBeCloseTo(30 * (20 / 200), 9);
    expect(e.output(a)!.vpkgs[0]!.energyJ).toBeCloseTo(100 * (60 / 200), 9);
    const dram = r.packages[0]!.domains!.find((d) => d.domain === 'dram')!;
    expect(dram.energyJ).toBeCloseTo(30, 9);
    expect(dram.attributedJ).toBeCloseTo(30 * (80 / 200), 9);
    expect(r.vms.find((v) => v.vmId === a)!.domains).toEqual([{ domain: 'dram', vpkgEnergyJ: [expect.closeTo(9, 9)] }]);
    expect(e.output(a)!.domains![0]!.vpkgEnergyUj).toEqual([BigInt(Math.floor(e.output(a)!.domains![0]!.vpkgEnergyJ[0]! * 1e6))]);
  });

  test('a domain counter that wraps gives the energy across the wrap', () => {
    const range = 1_000_000_000n; // powercap: max_energy_range_uj + 1
    const e = new RatioEngine(hostWith([1], [{ domain: 'core', pkg: 0 }], range));
    const vm = e.register({ pid: 10, starttime: 1000, vcpus: [{ tid: 10, vpkg: 0 }] });
    e.addSample(sampleWith(0, { 0: units(0) }, { 'core 0': range - 2_000_000n }, { 10: [{ tid: 10, ticks: 0 }] }));
    e.addSample(sampleWith(1, { 0: units(10) }, { 'core 0': 3_000_000n }, { 10: [{ tid: 10, ticks: 100 }] }));
    expect(domainJ(e.output(vm), 'core')[0]).toBeCloseTo(5, 9);
  });

  test('a domain missing from a sample gives nothing that interval, and its next value brings the whole gap at once', () => {
    const e = new RatioEngine(hostWith([1], [{ domain: 'dram', pkg: 0 }]));
    const vm = e.register({ pid: 10, starttime: 1000, vcpus: [{ tid: 10, vpkg: 0 }] });
    const t = (k: number) => ({ 10: [{ tid: 10, ticks: 50 * k }] });
    e.addSample(sampleWith(0, { 0: units(0) }, { 'dram 0': 0n }, t(0)));
    const r1 = e.addSample(sampleWith(1, { 0: units(10) }, {}, t(1)))!;
    expect(r1.problems).toContain('no dram energy value for package 0 in this sample');
    expect(r1.packages[0]!.domains).toBeUndefined();
    expect(domainJ(e.output(vm), 'dram')[0]).toBe(0);
    e.addSample(sampleWith(2, { 0: units(20) }, { 'dram 0': 8_000_000n }, t(2)));
    // 8 J over the two seconds arrive with the second interval's share: 50 of 100 ticks.
    expect(domainJ(e.output(vm), 'dram')[0]).toBeCloseTo(4, 9);
  });

  test('psys is shared across every package by CPU time over every CPU, and reported under the package it is read on', () => {
    const e = new RatioEngine(hostWith([1, 1], [{ domain: 'psys', pkg: 0 }]));
    const a = e.register({ pid: 10, starttime: 1000, vcpus: [{ tid: 10, vpkg: 0 }] });
    const b = e.register({ pid: 20, starttime: 1000, vcpus: [{ tid: 20, vpkg: 0 }] });
    const t = (k: number) => ({ 10: [{ tid: 10, ticks: 100 * k, cpu: 0 }], 20: [{ tid: 20, ticks: 50 * k, cpu: 1 }] });
    e.addSample(sampleWith(0, { 0: units(0), 1: units(0) }, { 'psys 0': 0n }, t(0)));
    const r = e.addSample(sampleWith(1, { 0: units(10), 1: units(10) }, { 'psys 0': 40_000_000n }, t(1)))!;
    // capacity: 100 ticks x 2 CPUs; a ran 100 (on package 0), b 50 (on package 1).
    expect(domainJ(e.output(a), 'psys')[0]).toBeCloseTo(20, 9);
    expect(domainJ(e.output(b), 'psys')[0]).toBeCloseTo(10, 9);
    expect(r.packages[0]!.domains).toEqual([{ domain: 'psys', energyJ: expect.closeTo(40, 9), attributedJ: expect.closeTo(30, 9) }]);
    expect(r.packages[1]!.domains).toBeUndefined();
  });

  test('non-vCPU threads give their domain energy to the vCPUs, per domain as for the package', () => {
    const e = new RatioEngine(hostWith([1], [{ domain: 'uncore', pkg: 0 }]));
    const vm = twoSocketVm(e);
    const t = (k: number) => ({
      10: [
        { tid: 10, ticks: 20 * k },
        { tid: 11, ticks: 40 * k },
        { tid: 12, ticks: 0 },
      ],
    });
    e.addSample(sampleWith(0, { 0: units(0) }, { 'uncore 0': 0n }, t(0)));
    e.addSample(sampleWith(1, { 0: units(10) }, { 'uncore 0': 10_000_000n }, t(1)));
    // e(11) = 4 J, e(10) = 2 J shared by both vCPUs: vpkg 0 gets 5, vpkg 1 gets 1.
    const j = domainJ(e.output(vm), 'uncore');
    expect(j[0]).toBeCloseTo(5, 9);
    expect(j[1]).toBeCloseTo(1, 9);
    expect(sum(j)).toBeCloseTo(6, 9);
  });

  test('a host without other domains publishes no domains field', () => {
    const e = new RatioEngine(host([1]));
    const vm = e.register({ pid: 10, starttime: 1000, vcpus: [{ tid: 10, vpkg: 0 }] });
    e.addSample(sample(0, { 0: units(0) }, { 10: [{ tid: 10, ticks: 0 }] }));
    const r = e.addSample(sample(1, { 0: units(5) }, { 10: [{ tid: 10, ticks: 10 }] }))!;
    expect(e.output(vm)!.domains).toBeUndefined();
    expect(r.packages[0]!.domains).toBeUndefined();
    expect(r.vms[0]!.domains).toBeUndefined();
  });

  test('domain readings the host does not read are reported and ignored', () => {
    const e = new RatioEngine(hostWith([1], [{ domain: 'dram', pkg: 0 }]));
    e.addSample(sampleWith(0, { 0: units(0) }, { 'dram 0': 0n, 'core 0': 5n, 'dram 3': 1n }, {}));
    expect(e.lastProblems).toEqual([
      'core energy given for package 0, which the host does not read: ignored',
      'dram energy given for package 3, which the host does not read: ignored',
    ]);
  });

  test('the constructor refuses a domain counter that is not a domain, off the host, listed twice, or a second psys', () => {
    expect(() => new RatioEngine(hostWith([1], [{ domain: 'package' as 'dram', pkg: 0 }]))).toThrow(
      /not a RAPL domain besides the package/,
    );
    expect(() => new RatioEngine(hostWith([1], [{ domain: 'dram', pkg: 2 }]))).toThrow(/package 2 is not among the host's packages/);
    expect(
      () =>
        new RatioEngine(
          hostWith(
            [1],
            [
              { domain: 'dram', pkg: 0 },
              { domain: 'dram', pkg: 0 },
            ],
          ),
        ),
    ).toThrow(/listed twice/);
    expect(
      () =>
        new RatioEngine(
          hostWith(
            [1, 1],
            [
              { domain: 'psys', pkg: 0 },
              { domain: 'psys', pkg: 1 },
            ],
          ),
        ),
    ).toThrow(/counts the whole platform/);
    expect(() => new RatioEngine(hostWith([1], [{ domain: 'dram', pkg: 0 }], 1n << 60n))).toThrow(/out of 2\.\.2\^53/);
  });

  test('state() and restore() carry the domain totals and counters: the interval after a restart spans the gap', () => {
    const h = hostWith([1], [{ domain: 'dram', pkg: 0 }]);
    const t = (k: number) => ({ 10: [{ tid: 10, ticks: 50 * k }] });
    const live = new RatioEngine(h);
    const vm = live.register({ pid: 10, starttime: 1000, vcpus: [{ tid: 10, vpkg: 0 }] });
    live.addSample(sampleWith(0, { 0: units(0) }, { 'dram 0': 0n }, t(0)));
    live.addSample(sampleWith(1, { 0: units(10) }, { 'dram 0': 4_000_000n }, t(1)));
    const restored = new RatioEngine(h);
    restored.restore(live.state());
    for (const e of [live, restored]) e.addSample(sampleWith(3, { 0: units(30) }, { 'dram 0': 10_000_000n }, t(3)));
    expect(domainJ(restored.output(vm), 'dram')).toEqual(domainJ(live.output(vm), 'dram'));
    expect(domainJ(restored.output(vm), 'dram')[0]).toBeCloseTo(2 + 3, 9);
  });

  test('restore() into an engine reading other domains starts the new ones at 0 and drops the ones it does not read', () => {
    const live = new RatioEngine(hostWith([1], [{ domain: 'dram', pkg: 0 }]));
    const vm = live.register({ pid: 10, starttime: 1000, vcpus: [{ tid: 10, vpkg: 0 }] });
    live.addSample(sampleWith(0, { 0: units(0) }, { 'dram 0': 0n }, { 10: [{ tid: 10, ticks: 0 }] }));
    live.addSample(sampleWith(1, { 0: units(10) }, { 'dram 0': 4_000_000n }, { 10: [{ tid: 10, ticks: 100 }] }));
    const other = new RatioEngine(hostWith([1], [{ domain: 'core', pkg: 0 }]));
    other.restore(live.state());
    expect(other.output(vm)!.domains).toEqual([{ domain: 'core', vpkgEnergyJ: [0], vpkgEnergyUj: [0n] }]);
    expect(other.output(vm)!.vpkgs[0]!.energyJ).toBeCloseTo(10, 9);
  });
});
