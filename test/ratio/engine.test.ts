/**
 * One test per ratio.md rule, each with numbers computed by hand in the comment above it.
 * Default host: 1 package, 2 CPUs, CLK_TCK 100, 2^-14 J per counter unit; so over dt = 1 s the
 * package capacity is 100 * 1 * 2 = 200 ticks, and 100 J over 50 ticks gives 25 J.
 */
import { describe, expect, it } from 'vitest';
import { RatioEngine } from '../../src/ratio/attribution.js';
import type { VmSpec } from '../../src/model/vm.js';
import { host, PU_ESU14, sample, statLine, units } from './helpers.js';

const PID = 500;
/** vCPUs 501 (vpkg 0) and 502 (vpkg 1); main thread 500 and an I/O thread 503 are non-vCPU. */
const VM: VmSpec = {
  pid: PID,
  starttime: 1000,
  name: 'vm',
  vcpus: [
    { tid: 501, vpkg: 0 },
    { tid: 502, vpkg: 1 },
  ],
};

function engineWithBaseline(threads: { tid: number; ticks: number; cpu?: number; starttime?: number }[], energy = 0n, vm: VmSpec = VM) {
  const e = new RatioEngine(host());
  const id = e.register(vm);
  expect(e.addSample(sample(10, { 0: energy }, { [vm.pid]: threads }))).toBeNull();
  return { e, id };
}

describe('RatioEngine: ratio.md rules', () => {
  it('basic share: 100 J over a 200-tick capacity, a vCPU with 50 ticks gets 25 J', () => {
    const { e, id } = engineWithBaseline([
      { tid: 500, ticks: 0 },
      { tid: 501, ticks: 100 },
      { tid: 502, ticks: 0 },
    ]);
    const r = e.addSample(
      sample(
        11,
        { 0: units(100) },
        {
          [PID]: [
            { tid: 500, ticks: 0 },
            { tid: 501, ticks: 150 },
            { tid: 502, ticks: 0 },
          ],
        },
      ),
    )!;
    expect(r.dtS).toBe(1);
    expect(r.packages).toEqual([{ pkg: 0, energyJ: 100, attributedJ: 25 }]);
    expect(r.vms).toEqual([{ vmId: id, pid: PID, vpkgEnergyJ: [25, 0] }]);
    expect(e.output(id)!.vpkgs.map((v) => v.energyJ)).toEqual([25, 0]);
  });

  it('measured dt: over 0.5 s the capacity is 100 ticks, so 50 ticks take half of dE (50 J), not a quarter', () => {
    const { e } = engineWithBaseline([{ tid: 501, ticks: 0 }]);
    const r = e.addSample(sample(10.5, { 0: units(100) }, { [PID]: [{ tid: 501, ticks: 50 }] }))!;
    expect(r.dtS).toBe(0.5);
    expect(r.vms[0]!.vpkgEnergyJ[0]).toBeCloseTo(50, 12);
  });

  it('32-bit wrap: 0xffffc000 -> 99 J worth of units is a delta of 100 J (16384 units wrapped + 99 J)', () => {
    const { e } = engineWithBaseline([{ tid: 501, ticks: 0 }], 0xffffc000n);
    const r = e.addSample(sample(11, { 0: units(99) }, { [PID]: [{ tid: 501, ticks: 200 }] }))!;
    expect(r.packages[0]!.energyJ).toBe(100);
    expect(r.vms[0]!.vpkgEnergyJ[0]).toBe(100);
  });

  it('only bits 31:0 of the energy MSR count (reserved high bits are ignored)', () => {
    const { e } = engineWithBaseline([{ tid: 501, ticks: 0 }], 0xabcd_0000_0000n);
    const r = e.addSample(sample(11, { 0: 0x1234_0000_0000n + units(10) }, { [PID]: [{ tid: 501, ticks: 200 }] }))!;
    expect(r.packages[0]!.energyJ).toBe(10);
  });

  it('birth: a thread present only in S(i) counts all its ticks (30 ticks -> 15 J)', () => {
    const { e } = engineWithBaseline([{ tid: 501, ticks: 0 }]);
    const r = e.addSample(
      sample(
        11,
        { 0: units(100) },
        {
          [PID]: [
            { tid: 501, ticks: 0 },
            { tid: 502, ticks: 30 },
          ],
        },
      ),
    )!;
    expect(r.vms[0]!.vpkgEnergyJ).toEqual([0, 15]);
  });

  it('exit: a thread present only in S(i-1) contributes nothing (no unsigned underflow as in QEMU)', () => {
    const { e } = engineWithBaseline([
      { tid: 501, ticks: 40 },
      { tid: 502, ticks: 1_000_000 },
    ]);
    const r = e.addSample(sample(11, { 0: units(100) }, { [PID]: [{ tid: 501, ticks: 80 }] }))!;
    // 40 ticks -> 100 * 40 / 200 = 20 J; 502 is gone and gets nothing, nor does it inflate D_p.
    expect(r.vms[0]!.vpkgEnergyJ).toEqual([20, 0]);
    expect(r.packages[0]!.attributedJ).toBe(20);
  });

  it('tid reuse: same tid, new starttime -> a new thread, dticks = its ticks (10 -> 5 J), not 10 - 500', () => {
    const { e } = engineWithBaseline([{ tid: 502, ticks: 500, starttime: 1000 }]);
    const r = e.addSample(sample(11, { 0: units(100) }, { [PID]: [{ tid: 502, ticks: 10, starttime: 2000 }] }))!;
    expect(r.vms[0]!.vpkgEnergyJ).toEqual([0, 5]);
  });

  it('a tick counter that went backwards with the same identity counts 0', () => {
    const { e } = engineWithBaseline([{ tid: 501, ticks: 500 }]);
    const r = e.addSample(sample(11, { 0: units(100) }, { [PID]: [{ tid: 501, ticks: 490 }] }))!;
    expect(r.vms[0]!.vpkgEnergyJ).toEqual([0, 0]);
  });

  it('clamp: 300 + 100 ticks on a 200-tick package are scaled by 200/400 -> 75 J and 25 J, total = dE', () => {
    const { e } = engineWithBaseline([
      { tid: 501, ticks: 0 },
      { tid: 502, ticks: 0 },
    ]);
    const r = e.addSample(
      sample(
        11,
        { 0: units(100) },
        {
          [PID]: [
            { tid: 501, ticks: 300 },
            { tid: 502, ticks: 100 },
          ],
        },
      ),
    )!;
    expect(r.vms[0]!.vpkgEnergyJ).toEqual([75, 25]);
    expect(r.packages[0]!.attributedJ).toBe(100);
  });

  it('clamp counts the ticks of every registered VM on the package, across VMs', () => {
    const e = new RatioEngine(host());
    const a = e.register({ pid: 600, starttime: 1000, vcpus: [{ tid: 601, vpkg: 0 }] });
    const b = e.register({ pid: 700, starttime: 1000, vcpus: [{ tid: 701, vpkg: 0 }] });
    e.addSample(sample(10, { 0: 0n }, { 600: [{ tid: 601, ticks: 0 }], 700: [{ tid: 701, ticks: 0 }] }));
    // 300 + 100 = 400 > 200: A gets 100 * 300/400 = 75 J, B 25 J.
    const r = e.addSample(sample(11, { 0: units(100) }, { 600: [{ tid: 601, ticks: 300 }], 700: [{ tid: 701, ticks: 100 }] }))!;
    expect(r.vms.map((v) => [v.vmId, v.vpkgEnergyJ[0]])).toEqual([
      [a, 75],
      [b, 25],
    ]);
  });

  it('package move: the package of the interval is the one of `processor` in S(i)', () => {
    // Two packages of 2 CPUs each: cpu 0,1 -> pkg 0; cpu 2,3 -> pkg 1. pkg 0 gives 100 J, pkg 1 gives 40 J.
    const e = new RatioEngine(host([2, 2]));
    e.register(VM);
    e.addSample(sample(10, { 0: 0n, 1: 0n }, { [PID]: [{ tid: 501, ticks: 0, cpu: 0 }] }));
    const r = e.addSample(sample(11, { 0: units(100), 1: units(40) }, { [PID]: [{ tid: 501, ticks: 50, cpu: 3 }] }))!;
    // On pkg 1: 40 * 50 / 200 = 10 J (it would be 25 J if the old CPU's package were used).
    expect(r.vms[0]!.vpkgEnergyJ).toEqual([10, 0]);
    expect(r.packages).toEqual([
      { pkg: 0, energyJ: 100, attributedJ: 0 },
      { pkg: 1, energyJ: 40, attributedJ: 10 },
    ]);
  });

  it('capacity uses n_p, the online CPUs of that package (3 CPUs -> 300 ticks a second)', () => {
    const e = new RatioEngine(host([3]));
    e.register(VM);
    e.addSample(sample(10, { 0: 0n }, { [PID]: [{ tid: 501, ticks: 0 }] }));
    const r = e.addSample(sample(11, { 0: units(90) }, { [PID]: [{ tid: 501, ticks: 100 }] }))!;
    expect(r.vms[0]!.vpkgEnergyJ[0]).toBeCloseTo(30, 12);
  });

  it('non-vCPU energy W is split equally over the present vCPUs (main + I/O thread: 10 + 5 J -> 7.5 J each)', () => {
    const { e } = engineWithBaseline([
      { tid: 500, ticks: 0 },
      { tid: 501, ticks: 0 },
      { tid: 502, ticks: 0 },
      { tid: 503, ticks: 0 },
    ]);
    // main 20 ticks = 10 J, I/O 10 ticks = 5 J, vCPU 501 40 ticks = 20 J, vCPU 502 0 ticks.
    const r = e.addSample(
      sample(
        11,
        { 0: units(100) },
        {
          [PID]: [
            { tid: 500, ticks: 20 },
            { tid: 501, ticks: 40 },
            { tid: 502, ticks: 0 },
            { tid: 503, ticks: 10 },
          ],
        },
      ),
    )!;
    expect(r.vms[0]!.vpkgEnergyJ).toEqual([27.5, 7.5]);
    expect(r.packages[0]!.attributedJ).toBe(35);
  });

  it('the main thread (tid == pid) is a non-vCPU thread, not skipped as in QEMU', () => {
    const { e } = engineWithBaseline([
      { tid: 500, ticks: 0 },
      { tid: 501, ticks: 0 },
    ]);
    const r = e.addSample(
      sample(
        11,
        { 0: units(100) },
        {
          [PID]: [
            { tid: 500, ticks: 40 },
            { tid: 501, ticks: 0 },
          ],
        },
      ),
    )!;
    // W = 100 * 40 / 200 = 20 J, one present vCPU (501), 502 absent.
    expect(r.vms[0]!.vpkgEnergyJ).toEqual([20, 0]);
  });

  it('a virtual package with no present vCPU gets 0 and W goes to the present ones only', () => {
    const { e } = engineWithBaseline([
      { tid: 500, ticks: 0 },
      { tid: 501, ticks: 0 },
    ]);
    const r = e.addSample(
      sample(
        11,
        { 0: units(100) },
        {
          [PID]: [
            { tid: 500, ticks: 20 },
            { tid: 501, ticks: 20 },
          ],
        },
      ),
    )!;
    expect(r.vms[0]!.vpkgEnergyJ).toEqual([20, 0]);
  });

  it('with no vCPU present, W is dropped and not counted as attributed', () => {
    const { e } = engineWithBaseline([{ tid: 500, ticks: 0 }]);
    const r = e.addSample(sample(11, { 0: units(100) }, { [PID]: [{ tid: 500, ticks: 100 }] }))!;
    expect(r.vms[0]!.vpkgEnergyJ).toEqual([0, 0]);
    expect(r.packages[0]!.attributedJ).toBe(0);
  });

  it('a vCPU tid absent from a sample contributes nothing for that interval; back later, it is "born" again', () => {
    const { e } = engineWithBaseline([
      { tid: 501, ticks: 10 },
      { tid: 502, ticks: 10 },
    ]);
    const r1 = e.addSample(sample(11, { 0: units(100) }, { [PID]: [{ tid: 501, ticks: 50 }] }))!;
    expect(r1.vms[0]!.vpkgEnergyJ).toEqual([20, 0]);
    // 502 was absent from S(i-1): dticks = its ticks, 30 -> 15 J (ratio.md step 3, read literally).
    const r2 = e.addSample(
      sample(
        12,
        { 0: units(200) },
        {
          [PID]: [
            { tid: 501, ticks: 50 },
            { tid: 502, ticks: 30 },
          ],
        },
      ),
    )!;
    expect(r2.vms[0]!.vpkgEnergyJ).toEqual([0, 15]);
  });

  it('ended VM: pid absent -> ended with that sample, frozen, listed no more, kept in outputs until forgotten', () => {
    const { e, id } = engineWithBaseline([{ tid: 501, ticks: 0 }]);
    e.addSample(sample(11, { 0: units(100) }, { [PID]: [{ tid: 501, ticks: 50 }] }));
    expect(e.activePids()).toEqual([PID]);
    expect(e.ended(id)).toBe(false);
    const r = e.addSample(sample(12, { 0: units(200) }, {}))!;
    expect(r.ended).toEqual([id]);
    expect(e.ended(id)).toBe(true);
    expect(r.vms).toEqual([]);
    expect(e.activePids()).toEqual([]);
    const out = e.output(id)!;
    expect(out).toMatchObject({ ended: true, tNs: 11_000_000_000n });
    expect(out.vpkgs[0]!.energyJ).toBe(25);
    // Even if the pid comes back with the same threads, nothing more is attributed.
    e.addSample(sample(13, { 0: units(300) }, { [PID]: [{ tid: 501, ticks: 250 }] }));
    expect(e.output(id)!.vpkgs[0]!.energyJ).toBe(25);
    expect(e.outputs().map((o) => o.vmId)).toEqual([id]);
    e.forget(id);
    expect(e.output(id)).toBeUndefined();
    expect(e.ended(id)).toBe(true); // unknown counts as ended, as output(id)?.ended ?? true did
    expect(e.outputs()).toEqual([]);
    e.forget(12345); // unknown ids are ignored
  });

  it('pid reuse: the main thread starttime differs from the registered one -> ended', () => {
    const { e, id } = engineWithBaseline([
      { tid: 500, ticks: 0 },
      { tid: 501, ticks: 0 },
    ]);
    const r = e.addSample(
      sample(
        11,
        { 0: units(100) },
        {
          [PID]: [
            { tid: 500, ticks: 5, starttime: 9999 },
            { tid: 501, ticks: 100 },
          ],
        },
      ),
    )!;
    expect(r.ended).toEqual([id]);
    expect(r.vms).toEqual([]);
    expect(r.packages[0]!.attributedJ).toBe(0);
    expect(e.output(id)!.ended).toBe(true);
  });

  it('a VM whose pid is already gone at its baseline sample ends right there', () => {
    const e = new RatioEngine(host());
    e.addSample(sample(9, { 0: 0n }));
    const id = e.register(VM);
    const r = e.addSample(sample(10, { 0: units(10) }, {}))!;
    expect(r.ended).toEqual([id]);
    expect(e.output(id)).toMatchObject({ ended: true, tNs: 0n });
  });

  it('unregister freezes the VM and ends it; registration is effective from the next sample (its baseline)', () => {
    const e = new RatioEngine(host());
    expect(e.addSample(sample(9, { 0: 0n }))).toBeNull();
    const id = e.register(VM);
    expect(id).toBe(1);
    expect(e.nvpkg(id)).toBe(2);
    expect(e.output(id)).toMatchObject({ ended: false, tNs: 0n });
    // Baseline sample: the VM is not in this interval, nothing before it counts (its ticks are high).
    const r0 = e.addSample(sample(10, { 0: units(100) }, { [PID]: [{ tid: 501, ticks: 100 }] }))!;
    expect(r0.vms).toEqual([]);
    const r1 = e.addSample(sample(11, { 0: units(200) }, { [PID]: [{ tid: 501, ticks: 120 }] }))!;
    expect(r1.vms[0]!.vpkgEnergyJ).toEqual([10, 0]);
    e.unregister(id);
    expect(e.activePids()).toEqual([]);
    const r2 = e.addSample(sample(12, { 0: units(300) }, { [PID]: [{ tid: 501, ticks: 320 }] }))!;
    expect(r2.vms).toEqual([]);
    expect(r2.ended).toEqual([]);
    expect(e.output(id)).toMatchObject({ ended: true, tNs: 11_000_000_000n });
    expect(e.register(VM)).toBe(2);
  });

  it('outputs: energy_uj = floor(A * 1e6), counter = floor(A / u_guest)', () => {
    // 3 CPUs: capacity 300 ticks; 100 of them get 100 * 100 / 300 = 33.333... J.
    const e = new RatioEngine(host([3]));
    const id = e.register(VM);
    e.addSample(sample(10, { 0: 0n }, { [PID]: [{ tid: 501, ticks: 0 }] }));
    e.addSample(sample(11, { 0: units(100) }, { [PID]: [{ tid: 501, ticks: 100 }] }));
    const v = e.output(id)!.vpkgs[0]!;
    expect(v.energyJ).toBeCloseTo(100 / 3, 12);
    expect(v.energyUj).toBe(33_333_333n);
    expect(v.counter).toBe(546_133); // floor(33.333... * 16384)
    expect(e.output(id)!.tNs).toBe(11_000_000_000n);
    expect(e.guestPowerUnit).toBe(PU_ESU14);
  });

  it('counter wraps mod 2^32 while energy_uj keeps counting (ESU 0: 1 J per unit, 3e9 J twice)', () => {
    const e = new RatioEngine(host([2], 0x3n));
    const id = e.register(VM);
    e.addSample(sample(10, { 0: 0n }, { [PID]: [{ tid: 501, ticks: 0 }] }));
    e.addSample(sample(11, { 0: 3_000_000_000n }, { [PID]: [{ tid: 501, ticks: 200 }] }));
    expect(e.output(id)!.vpkgs[0]!.counter).toBe(3_000_000_000);
    e.addSample(sample(12, { 0: 6_000_000_000n % 2n ** 32n }, { [PID]: [{ tid: 501, ticks: 400 }] }));
    const v = e.output(id)!.vpkgs[0]!;
    expect(v.energyJ).toBe(6e9);
    expect(v.counter).toBe(6e9 - 2 ** 32);
    expect(v.energyUj).toBe(6_000_000_000_000_000n);
  });

  it('rejects a sample that is not after the previous one, without changing state', () => {
    const { e, id } = engineWithBaseline([{ tid: 501, ticks: 0 }]);
    expect(() => e.addSample(sample(10, { 0: units(500) }, { [PID]: [{ tid: 501, ticks: 200 }] }))).toThrow(/not after/);
    expect(() => e.addSample(sample(9, { 0: units(500) }, {}))).toThrow(/not after/);
    expect(e.output(id)!.ended).toBe(false);
    const r = e.addSample(sample(11, { 0: units(100) }, { [PID]: [{ tid: 501, ticks: 50 }] }))!;
    expect(r.vms[0]!.vpkgEnergyJ).toEqual([25, 0]);
  });

  it('unparsable stat lines and lines for another tid are absent and reported, never thrown', () => {
    const { e } = engineWithBaseline([
      { tid: 501, ticks: 0 },
      { tid: 502, ticks: 0 },
    ]);
    const s = sample(11, { 0: units(100) }, { [PID]: [{ tid: 501, ticks: 50 }] });
    s.tasks.get(PID)!.set(502, '502 (CPU 1/KVM) R 1 2 3');
    s.tasks.get(PID)!.set(503, statLine({ tid: 999, utime: 100, starttime: 1000, processor: 0 }));
    s.tasks.get(PID)!.set(504, '');
    const r = e.addSample(s)!;
    expect(r.vms[0]!.vpkgEnergyJ).toEqual([25, 0]);
    expect(r.problems).toHaveLength(3);
    expect(r.problems.join('\n')).toMatch(/tid 502: stat line not understood/);
    expect(r.problems.join('\n')).toMatch(/tid 503: stat line is for tid 999/);
  });

  it('a main-thread line that cannot be read does not end the VM (it cannot prove pid reuse)', () => {
    const { e, id } = engineWithBaseline([
      { tid: 500, ticks: 0 },
      { tid: 501, ticks: 0 },
    ]);
    const s = sample(11, { 0: units(100) }, { [PID]: [{ tid: 501, ticks: 50 }] });
    s.tasks.get(PID)!.set(PID, '500 (qemu');
    const r = e.addSample(s)!;
    expect(r.ended).toEqual([]);
    expect(r.vms.map((v) => v.vmId)).toEqual([id]);
  });

  it('a processor not in the host map: reported, the thread gets no energy and adds no ticks to any package', () => {
    const { e } = engineWithBaseline([
      { tid: 501, ticks: 0 },
      { tid: 502, ticks: 0 },
    ]);
    const r = e.addSample(
      sample(
        11,
        { 0: units(100) },
        {
          [PID]: [
            { tid: 501, ticks: 400, cpu: 7 },
            { tid: 502, ticks: 100 },
          ],
        },
      ),
    )!;
    // 502 alone on pkg 0: 100/200 of 100 J; 501's 400 ticks would have clamped it, but they are on no package.
    expect(r.vms[0]!.vpkgEnergyJ).toEqual([0, 50]);
    expect(r.problems.join('\n')).toMatch(/cpu 7/);
  });

  it('energy for an unknown package is ignored and reported; a missing package gives no interval energy and rebaselines', () => {
    const e = new RatioEngine(host([2, 2]));
    e.register(VM);
    e.addSample(sample(10, { 0: 0n, 1: 0n }, { [PID]: [{ tid: 501, ticks: 0, cpu: 2 }] }));
    const r1 = e.addSample(sample(11, { 0: units(100), 5: 7n }, { [PID]: [{ tid: 501, ticks: 50, cpu: 2 }] }))!;
    expect(r1.packages.map((p) => p.pkg)).toEqual([0]);
    expect(r1.vms[0]!.vpkgEnergyJ).toEqual([0, 0]);
    expect(r1.problems.join('\n')).toMatch(/package 5/);
    expect(r1.problems.join('\n')).toMatch(/no energy value for package 1/);
    // pkg 1 comes back at 1000 J: a new baseline, so this interval has no pkg-1 energy either.
    const r2 = e.addSample(sample(12, { 0: units(200), 1: units(1000) }, { [PID]: [{ tid: 501, ticks: 100, cpu: 2 }] }))!;
    expect(r2.packages.map((p) => p.pkg)).toEqual([0]);
    const r3 = e.addSample(sample(13, { 0: units(300), 1: units(1040) }, { [PID]: [{ tid: 501, ticks: 150, cpu: 2 }] }))!;
    expect(r3.packages[1]).toEqual({ pkg: 1, energyJ: 40, attributedJ: 10 });
  });

  it('the first sample returns null; an interval with no VM lists none', () => {
    const e = new RatioEngine(host());
    expect(e.addSample(sample(1, { 0: 0n }))).toBeNull();
    const r = e.addSample(sample(2, { 0: units(60) }))!;
    expect(r).toMatchObject({ vms: [], ended: [], problems: [] });
    expect(r.packages).toEqual([{ pkg: 0, energyJ: 60, attributedJ: 0 }]);
  });

  it('refuses an inconsistent host and bad registrations with clear errors', () => {
    expect(() => new RatioEngine({ ...host(), clkTck: 0 })).toThrow(/CLK_TCK/);
    expect(() => new RatioEngine({ ...host(), packages: [] })).toThrow(/no packages/);
    expect(() => new RatioEngine({ ...host(), cpus: [{ cpu: 0, pkg: 3 }] })).toThrow(/package 3/);
    const e = new RatioEngine(host());
    expect(() => e.register({ pid: 1, starttime: 1, vcpus: [{ tid: 2, vpkg: 256 }] })).toThrow(/0..255/);
    expect(() =>
      e.register({
        pid: 1,
        starttime: 1,
        vcpus: [
          { tid: 2, vpkg: 0 },
          { tid: 2, vpkg: 1 },
        ],
      }),
    ).toThrow(/twice/);
  });
});
