/**
 * Properties of the engine over random hosts, VMs and sample sequences (wraps, clamps, births,
 * exits, tid reuse, package moves, unknown CPUs, VMs ending): no package gives out more than its
 * delta, what is attributed to packages is what the VMs receive, published values never decrease,
 * and the same input always gives the same output.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { RatioEngine } from '../../src/ratio/attribution.js';
import type { IntervalResult, VmOutput } from '../../src/ratio/outputs.js';
import type { Sample } from '../../src/model/sample.js';
import type { VmSpec } from '../../src/model/vm.js';
import { host, sample, type ThreadAt } from './helpers.js';

interface ThreadStep {
  present: boolean;
  dticks: number;
  cpu: number;
  reuse: boolean;
}
interface Scenario {
  cpusPerPackage: number[];
  vms: { vcpuVpkgs: number[]; others: number }[];
  steps: { dtMs: number; dE: number[]; pidGone: boolean[]; threads: ThreadStep[][] }[];
}

const MAX_THREADS = 5;

const scenario: fc.Arbitrary<Scenario> = fc
  .record({
    cpusPerPackage: fc.array(fc.integer({ min: 1, max: 3 }), { minLength: 1, maxLength: 2 }),
    vms: fc.array(
      fc.record({
        vcpuVpkgs: fc.array(fc.integer({ min: 0, max: 2 }), { minLength: 1, maxLength: 3 }),
        others: fc.integer({ min: 1, max: 2 }),
      }),
      {
        minLength: 1,
        maxLength: 3,
      },
    ),
    nsteps: fc.integer({ min: 1, max: 10 }),
  })
  .chain(({ cpusPerPackage, vms, nsteps }) => {
    const ncpu = cpusPerPackage.reduce((a, b) => a + b, 0);
    const step = fc.record({
      dtMs: fc.integer({ min: 1, max: 3000 }),
      dE: fc.array(fc.integer({ min: 0, max: 2 ** 32 - 1 }), { minLength: cpusPerPackage.length, maxLength: cpusPerPackage.length }),
      pidGone: fc.array(
        fc.integer({ min: 0, max: 19 }).map((x) => x === 0),
        { minLength: vms.length, maxLength: vms.length },
      ),
      threads: fc.array(
        fc.array(
          fc.record({
            present: fc.integer({ min: 0, max: 9 }).map((x) => x !== 0),
            dticks: fc.integer({ min: 0, max: 600 }),
            cpu: fc.integer({ min: 0, max: ncpu }), // ncpu itself is a CPU the host map does not have
            reuse: fc.integer({ min: 0, max: 19 }).map((x) => x === 0),
          }),
          { minLength: MAX_THREADS, maxLength: MAX_THREADS },
        ),
        { minLength: vms.length, maxLength: vms.length },
      ),
    });
    return fc.record({
      cpusPerPackage: fc.constant(cpusPerPackage),
      vms: fc.constant(vms),
      steps: fc.array(step, { minLength: nsteps + 1, maxLength: nsteps + 1 }),
    });
  });

/** Turns a scenario into VM specs and the samples a sampler would have taken. */
function build(s: Scenario): { specs: VmSpec[]; samples: Sample[] } {
  const specs: VmSpec[] = s.vms.map((vm, v) => {
    const pid = 1000 * (v + 1);
    return { pid, starttime: 5, name: `vm${v}`, vcpus: vm.vcpuVpkgs.map((vpkg, i) => ({ tid: pid + 1 + i, vpkg })) };
  });
  const ticks = s.vms.map(() => new Array<number>(MAX_THREADS).fill(0));
  const starts = s.vms.map(() => new Array<number>(MAX_THREADS).fill(5));
  const energy = s.cpusPerPackage.map(() => 0);
  let tMs = 1000;
  const samples = s.steps.map((st) => {
    tMs += st.dtMs;
    st.dE.forEach((d, p) => (energy[p] = (energy[p]! + d) % 2 ** 32));
    const tasks: Record<number, ThreadAt[]> = {};
    s.vms.forEach((vm, v) => {
      if (st.pidGone[v]) return;
      const pid = specs[v]!.pid;
      const nthreads = Math.min(MAX_THREADS, 1 + vm.vcpuVpkgs.length + vm.others - 1);
      const list: ThreadAt[] = [];
      for (let k = 0; k < nthreads; k++) {
        const th = st.threads[v]![k]!;
        const tid = k === 0 ? pid : pid + k; // k = 0 is the main thread, then vCPUs, then others
        if (th.reuse && k !== 0) {
          starts[v]![k]! += 1;
          ticks[v]![k] = 0;
        }
        ticks[v]![k]! += th.dticks;
        if (th.present || k === 0) list.push({ tid, ticks: ticks[v]![k]!, starttime: starts[v]![k]!, cpu: th.cpu });
      }
      tasks[pid] = list;
    });
    return sample(tMs / 1000, Object.fromEntries(energy.map((e, p) => [p, BigInt(e)])), tasks);
  });
  return { specs, samples };
}

/**
 * `unique`: field 10 (minflt, which no rule reads) of every line holds the sample's index, so no line
 * repeats and the engine's shortcut for a VM whose lines all repeat is never taken.
 */
function run(s: Scenario, unique = false): { results: (IntervalResult | null)[]; outputs: VmOutput[][] } {
  const { specs, samples } = build(s);
  if (unique) {
    samples.forEach((smp, i) => {
      for (const lines of smp.tasks.values()) {
        for (const [tid, line] of lines) lines.set(tid, line.replace(/^(\d+ \([^)]*\) (?:\S+ ){7})0 /, `$1${i + 1} `));
      }
    });
  }
  const engine = new RatioEngine(host(s.cpusPerPackage));
  for (const spec of specs) engine.register(spec);
  const results: (IntervalResult | null)[] = [];
  const outputs: VmOutput[][] = [];
  for (const smp of samples) {
    results.push(engine.addSample(smp));
    outputs.push(engine.outputs());
  }
  return { results, outputs };
}

const UNIT = 2 ** -14;

describe('RatioEngine properties', () => {
  it('energy given out on a package never exceeds its delta, and VMs receive exactly what packages give out', () => {
    fc.assert(
      fc.property(scenario, (s) => {
        for (const r of run(s).results) {
          if (!r) continue;
          let given = 0;
          for (const p of r.packages) {
            expect(p.attributedJ).toBeGreaterThanOrEqual(0);
            expect(p.attributedJ).toBeLessThanOrEqual(p.energyJ * (1 + 1e-12));
            given += p.attributedJ;
          }
          const received = r.vms.reduce((a, v) => a + v.vpkgEnergyJ.reduce((x, y) => x + y, 0), 0);
          expect(Math.abs(received - given)).toBeLessThanOrEqual(1e-9 * Math.max(1, given));
        }
      }),
      { numRuns: 300 },
    );
  });

  it('energy_uj and the unwrapped counter never decrease; counter = floor(A / u) mod 2^32', () => {
    fc.assert(
      fc.property(scenario, (s) => {
        const { outputs } = run(s);
        const last = new Map<string, { uj: bigint; units: number }>();
        for (const snapshot of outputs) {
          for (const vm of snapshot) {
            for (const v of vm.vpkgs) {
              const key = `${vm.vmId}/${v.vpkg}`;
              const units = Math.floor(v.energyJ / UNIT);
              expect(v.counter).toBe(units % 2 ** 32);
              expect(v.energyUj).toBe(BigInt(Math.floor(v.energyJ * 1e6)));
              const before = last.get(key);
              if (before) {
                expect(v.energyUj >= before.uj).toBe(true);
                expect(units).toBeGreaterThanOrEqual(before.units);
              }
              last.set(key, { uj: v.energyUj, units });
            }
          }
        }
      }),
      { numRuns: 300 },
    );
  });

  it('an ended VM stays frozen', () => {
    fc.assert(
      fc.property(scenario, (s) => {
        const { outputs } = run(s);
        const frozen = new Map<number, string>();
        for (const snapshot of outputs) {
          for (const vm of snapshot) {
            const text = JSON.stringify(vm, (_k, x: unknown) => (typeof x === 'bigint' ? x.toString() : x));
            if (frozen.has(vm.vmId)) expect(text).toBe(frozen.get(vm.vmId));
            else if (vm.ended) frozen.set(vm.vmId, text);
          }
        }
      }),
      { numRuns: 200 },
    );
  });

  it('gives the same results whether idle VMs hand the same lines again or lines that differ only in fields no rule reads', () => {
    // Half the steps of each VM idle: no tick, no move, no thread coming or going.
    const idle = scenario.map((s) => {
      const last = s.vms.map(() => new Array<{ present: boolean; cpu: number } | undefined>(MAX_THREADS));
      return {
        ...s,
        steps: s.steps.map((st, i) => ({
          ...st,
          threads: st.threads.map((ths, v) =>
            ths.map((t, k) => {
              const was = last[v]![k];
              const now =
                (i + v) % 2 === 1 && was !== undefined ? { ...t, dticks: 0, reuse: false, present: was.present, cpu: was.cpu } : t;
              last[v]![k] = { present: now.present, cpu: now.cpu };
              return now;
            }),
          ),
        })),
      };
    });
    fc.assert(
      fc.property(idle, (s) => {
        const a = run(s);
        const b = run(s, true);
        expect(a.outputs).toEqual(b.outputs);
        expect(a.results.map((r) => r && { ...r, problems: r.problems.length })).toEqual(
          b.results.map((r) => r && { ...r, problems: r.problems.length }),
        );
      }),
      { numRuns: 300 },
    );
  });

  it('is deterministic: the same input gives the same output', () => {
    fc.assert(
      fc.property(scenario, (s) => {
        expect(run(s)).toEqual(run(s));
      }),
      { numRuns: 100 },
    );
  });

  it('gives the same results after a restore from state() at any sample as without it, and refuses a used engine', () => {
    fc.assert(
      fc.property(scenario, fc.nat(), (s, at) => {
        const { specs, samples } = build(s);
        const cut = at % samples.length;
        const whole = new RatioEngine(host(s.cpusPerPackage));
        for (const spec of specs) whole.register(spec);
        const before = new RatioEngine(host(s.cpusPerPackage));
        for (const spec of specs) before.register(spec);
        for (let i = 0; i <= cut; i++) {
          whole.addSample(samples[i]!);
          before.addSample(samples[i]!);
        }
        const after = new RatioEngine(host(s.cpusPerPackage));
        after.restore(structuredClone(before.state()));
        expect(after.state()).toEqual(before.state());
        expect(() => before.restore(before.state())).toThrow(/only an engine with no VM and no sample can be restored/);
        for (let i = cut + 1; i < samples.length; i++) {
          const a = whole.addSample(samples[i]!);
          const b = after.addSample(samples[i]!);
          expect(b).toEqual(a);
          expect(after.outputs()).toEqual(whole.outputs());
        }
      }),
      { numRuns: 200 },
    );
  });

  it('refuses to restore a state whose values are inconsistent, naming the value', () => {
    const engine = new RatioEngine(host([2]));
    engine.register({ pid: 1000, starttime: 5, vcpus: [{ tid: 1001, vpkg: 1 }] });
    engine.addSample(
      sample(
        1,
        { 0: 0n },
        {
          1000: [
            { tid: 1000, ticks: 1, starttime: 5 },
            { tid: 1001, ticks: 3, starttime: 5 },
          ],
        },
      ),
    );
    const good = engine.state();
    const cases: [(st: ReturnType<RatioEngine['state']>) => void, RegExp][] = [
      [(st) => (st.nextId = 1), /VM id 1 is out of range \(1..0\)/],
      [(st) => (st.vms[0]!.accJ = [0]), /VM 1: 1 energy totals for 2 virtual packages/],
      [(st) => (st.vms[0]!.accJ[0] = Number.NaN), /VM 1: an energy total is not a finite number/],
      [(st) => (st.lastSample!.energy[0]!.pkg = 7), /counter for package 7, which the host does not have/],
      [(st) => (st.lastSample = null), /VM 1 has had its baseline sample, but there is no last sample/],
      [(st) => st.vms[0]!.prev.push({ ...st.vms[0]!.prev[0]! }), /thread 1000 is marked twice/],
    ];
    for (const [edit, want] of cases) {
      const st = structuredClone(good);
      edit(st);
      const fresh = new RatioEngine(host([2]));
      expect(() => fresh.restore(st)).toThrow(want);
      expect(fresh.state()).toEqual({ nextId: 1, lastSample: null, vms: [] });
    }
  });
});
