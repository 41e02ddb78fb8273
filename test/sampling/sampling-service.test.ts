/**
 * The daemon's sampling service on the one tick loop, with discovery's hooks: a hold keeps it
 * sampling with no registered VM, prepare runs before each sample, and registrations made inside a
 * tick (a discovery scan) or while held neither start a second loop nor stop the running one.
 * Clock and timers are injected (test/support/manual-time.ts), so nothing waits.
 */
import { pino } from 'pino';
import { describe, expect, test } from 'vitest';
import { SamplingService } from '../../src/sampling/sampling-service.js';
import { settled } from '../../src/sampling/time-slices.js';
import { RatioEngine } from '../../src/ratio/attribution.js';
import type { VmSpec } from '../../src/model/vm.js';
import { host, sample, units } from '../ratio/helpers.js';
import { ManualTime } from '../support/manual-time.js';

const VM: VmSpec = { pid: 100, starttime: 1000, vcpus: [{ tid: 101, vpkg: 0 }] };

function serviceOn(time: ManualTime, prepare?: (s: SamplingService) => void) {
  let n = 0;
  const sampled: number[][] = [];
  const order: string[] = [];
  const svc: SamplingService = new SamplingService({
    engine: new RatioEngine(host()),
    sampler: {
      *sampleSteps(pids) {
        yield null;
        order.push('sample');
        sampled.push([...pids()]);
        n++;
        return {
          ...sample(
            n,
            { 0: units(10 * n) },
            {
              100: [
                { tid: 100, ticks: n },
                { tid: 101, ticks: 50 * n },
              ],
            },
          ),
          tNs: time.now,
        };
      },
    },
    intervalMs: 1000,
    log: pino({ level: 'silent' }),
    clock: time.clock,
    timers: time,
    interval: (t) => {
      if (!svc.begin()) return;
      order.push('prepare');
      prepare?.(svc);
      settled(svc.take(t), (s) => {
        if (s !== undefined) svc.attribute(s);
        svc.end();
      });
    },
  });
  return { svc, sampled, order };
}

describe('SamplingService', () => {
  test('a hold keeps it sampling with no VM, prepare runs before each sample, and letting go leaves nothing pending', async () => {
    const time = new ManualTime();
    const { svc, sampled, order } = serviceOn(time);
    expect(svc.running).toBe(false);
    svc.hold('discovery', true);
    expect([svc.running, time.pending]).toEqual([true, 1]);
    for (let i = 0; i < 3; i++) {
      time.fire();
      await turn();
    }
    expect(sampled).toEqual([[], [], []]);
    expect(order).toEqual(['prepare', 'sample', 'prepare', 'sample', 'prepare', 'sample']);
    expect(svc.stats.samples).toBe(3);
    svc.hold('discovery', false);
    expect([svc.running, time.pending]).toEqual([false, 0]);
  });

  test('unregistering the last VM stops the loop only when no hold is taken', async () => {
    const time = new ManualTime();
    const { svc } = serviceOn(time);
    svc.hold('discovery', true);
    time.fire();
    await turn();
    const id = svc.register(VM);
    svc.unregister(id);
    expect([svc.running, time.pending]).toEqual([true, 1]);
    svc.hold('discovery', false);
    expect(svc.running).toBe(false);

    const again = svc.register(VM);
    expect([svc.running, time.pending]).toEqual([true, 1]); // baseline at once
    svc.unregister(again);
    expect([svc.running, time.pending]).toEqual([false, 0]);
  });

  test('a VM registered by a scan inside a tick is sampled from the next tick on, on the same loop', async () => {
    const time = new ManualTime();
    let vmId: number | undefined;
    const { svc, sampled } = serviceOn(time, (s) => {
      if (vmId === undefined) vmId = s.register(VM);
    });
    const origin = time.now;
    svc.hold('discovery', true);
    time.fire(); // tick 0: the scan registers the VM, the sample already includes it (its baseline)
    await turn();
    expect(time.pending).toBe(1);
    time.fire();
    await turn();
    time.fire();
    await turn();
    expect(sampled).toEqual([[100], [100], [100]]);
    // Ticks 0, 1, 2 of one loop: a restart inside tick 0 would have fired tick 1 at the origin.
    expect(time.now - origin).toBe(2_000_000_000n);
    expect(time.pending).toBe(1);
    expect(svc.engine.output(vmId!)!.vpkgs[0]!.energyUj).toBeGreaterThan(0n);
  });
});

/** A sampler that reads one pid per step (as Sampler.sampleSteps does), calling `between` before each step (what runs between slices). */
function slicedOn(time: ManualTime, between: (svc: SamplingService, step: number) => void) {
  let n = 0;
  const read: number[][] = [];
  const VM_THREADS: Record<number, { tid: number; ticks: number }[]> = {
    100: [{ tid: 100, ticks: 0 }],
    200: [{ tid: 200, ticks: 0 }],
  };
  const svc: SamplingService = new SamplingService({
    engine: new RatioEngine(host()),
    sampler: {
      *sampleSteps(pids) {
        n++;
        const tasks: Record<number, { tid: number; ticks: number }[]> = {};
        const got: number[] = [];
        let step = 0;
        const readOne = (pid: number) => {
          got.push(pid);
          tasks[pid] = VM_THREADS[pid]!.map((t) => ({ tid: t.tid, ticks: t.ticks + n }));
        };
        for (const pid of [...pids()]) {
          between(svc, step++);
          if (!pids().has(pid) || got.includes(pid)) continue;
          readOne(pid);
          yield null;
        }
        for (const pid of pids()) if (!got.includes(pid)) readOne(pid);
        read.push(got);
        return { ...sample(n, { 0: units(10 * n) }, tasks), tNs: time.now };
      },
    },
    intervalMs: 1000,
    log: pino({ level: 'silent' }),
    clock: time.clock,
    timers: time,
  });
  return { svc, read };
}

/** After a tick's sample in one slice: the interval ended. */
const turn = () => new Promise((r) => setImmediate(r));

/** Until the tick in slices has finished (its sample counted). */
async function sampled(svc: SamplingService, count: number): Promise<void> {
  for (let i = 0; i < 100 && svc.stats.samples < count; i++) await new Promise((r) => setImmediate(r));
  expect(svc.stats.samples).toBe(count);
}

describe('SamplingService, a sample in slices', () => {
  test('a VM registered between the slices of a sample is read at its end: its baseline, not taken for ended', async () => {
    const time = new ManualTime();
    let late: number | undefined;
    const { svc, read } = slicedOn(time, (s) => {
      late ??= s.register({ pid: 200, starttime: 1000, vcpus: [{ tid: 200, vpkg: 0 }] });
    });
    svc.register(VM);
    time.fire();
    await sampled(svc, 1);
    expect(read[0]).toEqual([100, 200]);
    expect(svc.engine.output(late!)!.ended).toBe(false);
    time.fire();
    await sampled(svc, 2);
    expect(svc.engine.output(late!)!.ended).toBe(false);
  });

  test('a VM unregistered between the slices of a sample is not read', async () => {
    const time = new ManualTime();
    const ids: { second?: number } = {};
    const { svc, read } = slicedOn(time, (s, step) => {
      if (step === 1) s.unregister(ids.second!); // after pid 100 was read
    });
    svc.register(VM);
    ids.second = svc.register({ pid: 200, starttime: 1000, vcpus: [{ tid: 200, vpkg: 0 }] });
    time.fire();
    await sampled(svc, 1);
    expect(read[0]).toEqual([100]);
  });

  test('a tick due while the previous one still works in slices is skipped and counted', async () => {
    const time = new ManualTime();
    let release: (() => void) | undefined;
    const svc2: SamplingService = new SamplingService({
      engine: new RatioEngine(host()),
      sampler: {
        *sampleSteps() {
          yield null;
          return sample(1, { 0: units(1) });
        },
      },
      intervalMs: 1000,
      log: pino({ level: 'silent' }),
      clock: time.clock,
      timers: time,
      // An interval whose scan is pending until released.
      interval: (t) => {
        if (!svc2.begin()) return;
        void new Promise<void>((r) => (release = r)).then(() =>
          settled(svc2.take(t), (s) => {
            if (s !== undefined) svc2.attribute(s);
            svc2.end();
          }),
        );
      },
    });
    svc2.hold('discovery', true);
    time.fire(); // tick 0: prepare pending
    time.fire(); // tick 1, due meanwhile
    expect(svc2.stats).toMatchObject({ samples: 0, skippedTicks: 1 });
    release!();
    await sampled(svc2, 1);
  });

  test('a VM registered or unregistered between the slices of a sample is traced before that sample, and the times of the trace never go back', async () => {
    const time = new ManualTime();
    const records: { kind: string; tNs: bigint }[] = [];
    let step = 0;
    let late: number | undefined;
    const svc: SamplingService = new SamplingService({
      engine: new RatioEngine(host()),
      sampler: {
        *sampleSteps(pids) {
          const tNs = time.now; // the sample's time: when it began, as Sampler.sampleSteps takes it
          const tasks: Record<number, { tid: number; ticks: number }[]> = {};
          for (const pid of [...pids()]) {
            time.now += 5_000_000n; // slices take time, and clients are served between them
            if (step++ === 0) late = svc.register({ pid: 200, starttime: 1000, vcpus: [{ tid: 200, vpkg: 0 }] });
            else if (late !== undefined && step === 3) svc.unregister(late);
            tasks[pid] = [{ tid: pid, ticks: step }];
            yield null;
          }
          for (const pid of pids()) tasks[pid] ??= [{ tid: pid, ticks: step }];
          return { ...sample(step, { 0: units(10 * step) }, tasks), tNs };
        },
      },
      intervalMs: 1000,
      log: pino({ level: 'silent' }),
      clock: time.clock,
      timers: time,
      trace: {
        register: (tNs) => void records.push({ kind: 'register', tNs }),
        unregister: (tNs) => void records.push({ kind: 'unregister', tNs }),
        sample: (smp) => void records.push({ kind: 'sample', tNs: smp.tNs }),
      },
    });
    svc.register(VM);
    time.fire();
    await sampled(svc, 1);
    time.fire();
    await sampled(svc, 2);
    expect(records.map((r) => r.kind)).toEqual(['register', 'register', 'sample', 'unregister', 'sample']);
    for (let i = 1; i < records.length; i++) expect(records[i]!.tNs).toBeGreaterThanOrEqual(records[i - 1]!.tNs);
  });
});
