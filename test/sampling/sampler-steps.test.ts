/**
 * Sampler.sampleSteps on real /proc and fake MSR files: one VM per step, the pids asked again before
 * each read, so a VM unregistered between slices is not read and one registered meanwhile is read at
 * the end; sample() is the same work in one go.
 */
import { spawn } from 'node:child_process';
import { afterEach, describe, expect, test } from 'vitest';
import { MsrEnergySource } from '../../src/energy/msr-source.js';
import { MsrDevice } from '../../src/msr/device.js';
import { readHostCpus } from '../../src/msr/topology.js';
import { ProcTaskReader } from '../../src/os/proc-tasks.js';
import { Sampler } from '../../src/sampling/sampler.js';
import { FakeHost } from '../support/fake-host.js';

const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanups.splice(0).reverse()) c();
});

function setup(): Sampler {
  const h = new FakeHost({ packages: [0] });
  h.writeRapl({ powerUnit: 0xa0e03n, energy: { 0: 100 } });
  const device = new MsrDevice(h.msrPathTemplate);
  const tasks = new ProcTaskReader('/proc');
  cleanups.push(
    () => h.cleanup(),
    () => device.close(),
    () => tasks.close(),
  );
  const source = new MsrEnergySource({ device, cpus: readHostCpus(h.sysRoot), vendor: 'intel', sysRoot: h.sysRoot });
  return new Sampler(source, tasks);
}

/** Real processes to sample: sleeps of our own. */
function sleepers(n: number): number[] {
  const pids: number[] = [];
  for (let i = 0; i < n; i++) {
    const c = spawn('sleep', ['60'], { stdio: 'ignore' });
    cleanups.push(() => c.kill('SIGKILL'));
    pids.push(c.pid!);
  }
  return pids;
}

describe('Sampler.sampleSteps', () => {
  test('reads one VM per step, skips a pid dropped between steps and reads one added meanwhile at the end', () => {
    const sampler = setup();
    const [a, b, c, late] = sleepers(4) as [number, number, number, number];
    const wanted = new Set([a, b, c]);
    const steps = sampler.sampleSteps(() => wanted);
    expect(steps.next()).toEqual({ done: false, value: null }); // a read
    wanted.delete(b); // unregistered between slices
    wanted.add(late); // registered between slices
    let r = steps.next(); // c read
    expect(r.done).toBe(false);
    r = steps.next(); // the end: late read without a step
    expect(r.done).toBe(true);
    const s = r.value!;
    expect([...s.tasks.keys()].sort()).toEqual([a, c, late].sort());
    expect(s.energy).toEqual(new Map([[0, 100n]]));
  });

  test('sample() gives the same sample in one go', () => {
    const sampler = setup();
    const pids = sleepers(2);
    const s = sampler.sample([...pids, pids[0]!]);
    expect([...s.tasks.keys()].sort()).toEqual([...pids].sort());
  });
});
