/**
 * A sample's per-domain energy (Sample.domains) from the MSR source on fake MSR files: every domain
 * read, a domain that fails leaving the sample (and its package) going, the package failing failing it.
 */
import fs from 'node:fs';
import { afterEach, describe, expect, test } from 'vitest';
import type { EnergyReadError } from '../../src/energy/energy-source.js';
import { MsrEnergySource } from '../../src/energy/msr-source.js';
import { MsrDevice } from '../../src/msr/device.js';
import { MSR_DRAM_ENERGY_STATUS, MSR_PKG_ENERGY_STATUS } from '../../src/msr/registers.js';
import { readHostCpus } from '../../src/msr/topology.js';
import { ProcTaskReader } from '../../src/os/proc-tasks.js';
import { Sampler } from '../../src/sampling/sampler.js';
import { FakeHost } from '../support/fake-host.js';

const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanups.splice(0).reverse()) c();
});

function setup(domains: boolean): { h: FakeHost; sampler: Sampler; failures: EnergyReadError[] } {
  const h = new FakeHost({ packages: [0] });
  h.writeRapl({ powerUnit: 0xa0e03n, energy: { 0: 100 } });
  if (domains) h.setCounter([0], MSR_DRAM_ENERGY_STATUS, 200);
  const device = new MsrDevice(h.msrPathTemplate);
  const tasks = new ProcTaskReader('/proc');
  cleanups.push(
    () => h.cleanup(),
    () => device.close(),
    () => tasks.close(),
  );
  const source = new MsrEnergySource({ device, cpus: readHostCpus(h.sysRoot), vendor: 'intel', sysRoot: h.sysRoot });
  const failures: EnergyReadError[] = [];
  let t = 0n;
  return {
    h,
    sampler: new Sampler(
      source,
      tasks,
      () => ++t,
      (e) => failures.push(e),
    ),
    failures,
  };
}

describe('Sampler with RAPL domains', () => {
  test('carries every other domain counter as read beside the package counter, and no domains field when only the package is read', () => {
    const { sampler } = setup(true);
    const s = sampler.sample([]);
    expect(s.energy).toEqual(new Map([[0, 100n]]));
    expect(s.domains).toEqual([{ pkg: 0, domain: 'dram', raw: 200n }]);
    expect(setup(false).sampler.sample([]).domains).toBeUndefined();
  });

  test('a domain that fails leaves the sample and its package going, without that domain, and is reported', () => {
    const { h, sampler, failures } = setup(true);
    sampler.sample([]);
    fs.truncateSync(h.msrPath(0), MSR_DRAM_ENERGY_STATUS + 4); // cuts DRAM, keeps the package counter
    h.addEnergy(0, 50); // (rewrites only the package counter: the file stays cut below DRAM's end)
    const s = sampler.sample([]);
    expect(s.energy).toEqual(new Map([[0, 150n]]));
    expect(s.domains).toEqual([]);
    expect(failures.map((e) => e.domains)).toEqual([['dram']]);
  });

  test('the package failing fails the sample', () => {
    const { h, sampler, failures } = setup(true);
    sampler.sample([]);
    fs.truncateSync(h.msrPath(0), MSR_PKG_ENERGY_STATUS + 4);
    expect(() => sampler.sample([])).toThrow(
      /^cannot read MSR 0x611 on CPU 0: short read \(4 bytes\): .*MSR 0x611 \(Intel package energy status\); a fake MSR tree/,
    );
    expect(failures).toEqual([]);
  });
});
