/** --energy-source auto (energy/choose.ts): the MSRs when a device opens, else powercap, else both fixes named. */
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { chooseEnergySource, type ChooseOptions } from '../../src/energy/choose.js';
import { readHostCpus } from '../../src/msr/topology.js';
import { FakeHost } from '../support/fake-host.js';

const hosts: FakeHost[] = [];
afterEach(() => {
  for (const h of hosts.splice(0)) h.cleanup();
});

function options(withPowercap: boolean, withMsr: boolean): ChooseOptions {
  const h = new FakeHost({ packages: [0, 0, 1, 1], online: [1, 2, 3] }); // CPU 0 offline: the first CPU is 1
  hosts.push(h);
  if (withPowercap) {
    h.writePowercap([
      { id: '0', name: 'package-0', max: 1000n, uj: 1n },
      { id: '1', name: 'package-1', max: 1000n, uj: 1n },
    ]);
  }
  if (!withMsr) fs.rmSync(path.join(h.dir, 'dev'), { recursive: true });
  return { msrPathTemplate: h.msrPathTemplate, sysRoot: h.sysRoot, cpus: readHostCpus(h.sysRoot), vendor: 'intel' };
}

describe('chooseEnergySource', () => {
  test('a kind asked for is taken as it is, whatever opens', () => {
    expect(chooseEnergySource('synthetic', options(false, false))).toEqual({ kind: 'synthetic', why: 'asked for' });
    expect(chooseEnergySource('powercap', options(false, true))).toEqual({ kind: 'powercap', why: 'asked for' });
  });

  test('auto takes the MSRs when the first online CPU device opens, even with powercap there', () => {
    expect(chooseEnergySource('auto', options(true, true))).toEqual({ kind: 'msr', why: 'auto: the MSR devices open' });
  });

  test('auto takes powercap when no MSR device opens and every package zone does', () => {
    const o = options(true, false);
    expect(chooseEnergySource('auto', o)).toEqual({
      kind: 'powercap',
      why: `auto: no MSR device (${o.msrPathTemplate.replace('%u', '1')}: ENOENT), the powercap zones open`,
    });
  });

  test('auto fails naming both fixes when neither opens, and when a package has no zone', () => {
    expect(() => chooseEnergySource('auto', options(false, false))).toThrow(
      /^cannot find an energy source: no MSR device opens \(.*\/1\/msr: ENOENT\) and no powercap RAPL zone does \(.*\/class\/powercap: ENOENT\); load the msr driver with 'modprobe msr', or load the powercap RAPL driver with 'modprobe intel_rapl_msr' \(Intel and AMD Zen\), and run as root$/,
    );
    const o = options(true, false);
    fs.rmSync(path.join(o.sysRoot, 'class/powercap/intel-rapl:1'));
    expect(() => chooseEnergySource('auto', { ...o, alternative: 'use --energy-source synthetic' })).toThrow(
      /no powercap RAPL zone does \(no package-1 zone in .*\); .*, and run as root; or use --energy-source synthetic$/,
    );
  });
});
