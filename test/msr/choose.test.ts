/** --energy-source auto (energy/choose.ts): the MSRs when a device opens, else powercap, else what the host lacks and the fixes. */
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { chooseEnergySource, noEnergySourceMessage, type ChooseOptions } from '../../src/energy/choose.js';
import { TRY_WITHOUT_RAPL } from '../../src/msr/errno-hints.js';
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

  /** A /proc holding a cpuinfo with these flags. */
  function procWith(flags: string): string {
    const h = new FakeHost({ packages: [0] });
    hosts.push(h);
    const proc = path.join(h.dir, 'proc');
    fs.mkdirSync(proc, { recursive: true });
    fs.writeFileSync(path.join(proc, 'cpuinfo'), `processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: ${flags}\n\n`);
    return proc;
  }

  test('auto fails, when neither opens on a host that may have RAPL, leading with modprobe msr and offering synthetic and demo', () => {
    const o = { ...options(false, false), procRoot: procWith('fpu msr') };
    expect(() => chooseEnergySource('auto', o)).toThrow(
      /^cannot find an energy source: the msr driver is not loaded \(.*\/1\/msr: ENOENT\); no powercap RAPL zone opens \(.*\/class\/powercap: ENOENT\); load the msr driver with 'modprobe msr', or load the powercap RAPL driver with 'modprobe intel_rapl_msr' \(Intel and AMD Zen\), and run as root; or, to try vmsr-helper without RAPL: --energy-source synthetic \(.*\) or 'vmsr-helper demo'$/,
    );
    const p = { ...options(true, false), procRoot: o.procRoot };
    fs.rmSync(path.join(p.sysRoot, 'class/powercap/intel-rapl:1'));
    expect(() => chooseEnergySource('auto', p)).toThrow(/no powercap RAPL zone opens \(no package-1 zone in .*\); load the msr driver/);
  });

  test('auto fails, on a virtual machine or an AMD CPU without the rapl flag, saying the host has no RAPL and leading with synthetic and demo', () => {
    const vm = { ...options(false, false), procRoot: procWith('fpu msr hypervisor') };
    expect(() => chooseEnergySource('auto', vm)).toThrow(
      /^cannot find an energy source: this host is a virtual machine \(flag 'hypervisor' in .*\/cpuinfo\).*; the msr driver is not loaded .*; no powercap RAPL zone opens .*; to try vmsr-helper without RAPL: --energy-source synthetic .* or 'vmsr-helper demo'; on a host with RAPL, load the msr driver with 'modprobe msr'/,
    );
    const amd = { ...options(false, false), vendor: 'amd' as const, procRoot: procWith('fpu msr') };
    expect(() => chooseEnergySource('auto', amd)).toThrow(
      /^cannot find an energy source: this AMD CPU has no RAPL \(no flag 'rapl' in .*\); .*; to try vmsr-helper without RAPL/,
    );
    const amdRapl = { ...options(false, false), vendor: 'amd' as const, procRoot: procWith('fpu msr rapl') };
    expect(() => chooseEnergySource('auto', amdRapl)).toThrow(/^cannot find an energy source: the msr driver is not loaded/);
  });

  test('auto fails, when the driver is loaded but the device does not open, saying the driver is loaded', () => {
    const o = { ...options(false, false), procRoot: procWith('fpu msr') };
    fs.mkdirSync(path.join(o.sysRoot, 'module/msr'), { recursive: true });
    expect(() => chooseEnergySource('auto', o)).toThrow(
      /^cannot find an energy source: the msr driver is loaded but .*\/1\/msr does not open \(ENOENT\); .*; load the msr driver/,
    );
  });

  test('the message for a device this user may not open leads with run as root (root opens any file, so the facts are given)', () => {
    const message = noEnergySourceMessage({
      msrFile: '/dev/cpu/0/msr',
      msrWhy: 'EACCES',
      msrDriverLoaded: true,
      powercapWhy: '/sys/class/powercap: ENOENT',
      noRapl: null,
    });
    expect(message).toBe(
      `cannot find an energy source: the msr driver is loaded but this user may not open /dev/cpu/0/msr (EACCES); no powercap RAPL zone opens (/sys/class/powercap: ENOENT); run as root (or with CAP_SYS_RAWIO); or, ${TRY_WITHOUT_RAPL}`,
    );
  });
});
