import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { MsrDevice, MsrReadError, msrErrorWithHint } from '../../src/msr/device.js';
import { createEnergySource, readHostInfoFor, readsMsrs } from '../../src/energy/create.js';
import { ENERGY_SOURCE_KINDS } from '../../src/energy/kinds.js';
import { EnergyReadError, packageCounters } from '../../src/energy/energy-source.js';
import { MsrEnergySource } from '../../src/energy/msr-source.js';
import { SyntheticEnergySource, parseProcStat } from '../../src/energy/synthetic-source.js';
import { readHostInfo } from '../../src/msr/host-info.js';
import { readHostCpus } from '../../src/msr/topology.js';
import { ProcTaskReader } from '../../src/os/proc-tasks.js';
import { Sampler } from '../../src/sampling/sampler.js';
import { FakeHost } from '../support/fake-host.js';

const hosts: FakeHost[] = [];
function fake(packages: number[], online?: number[]): FakeHost {
  const h = new FakeHost(online ? { packages, online } : { packages });
  hosts.push(h);
  return h;
}
afterEach(() => {
  for (const h of hosts.splice(0)) h.cleanup();
});
const paths = (h: FakeHost) => ({ msrPathTemplate: h.msrPathTemplate, procRoot: '/proc', sysRoot: h.sysRoot });

describe('MsrEnergySource', () => {
  test('Intel: 0x611 through the first online CPU of each package, raw 64-bit', () => {
    const h = fake([0, 0, 1, 1], [1, 2, 3]); // CPU 0 offline: package 0 is read through CPU 1
    h.writeMsr(1, 0x611, 0xdead_0000_1234_5678n);
    h.writeMsr(2, 0x611, 0x42n);
    h.writeMsr(3, 0x611, 0x99n); // not the first CPU of package 1: never read
    const dev = new MsrDevice(h.msrPathTemplate);
    const src = new MsrEnergySource({ device: dev, cpus: readHostCpus(h.sysRoot), vendor: 'intel', sysRoot: h.sysRoot });
    expect(src.packages).toEqual([0, 1]);
    expect(packageCounters(src.read())).toEqual(
      new Map([
        [0, 0xdead_0000_1234_5678n],
        [1, 0x42n],
      ]),
    );
    h.writeMsr(2, 0x611, 0x43n);
    expect(packageCounters(src.read()).get(1)).toBe(0x43n);
    expect(dev.isOpen(0)).toBe(false);
    expect(dev.isOpen(3)).toBe(false);
    dev.close();
  });

  test('AMD: 0xC001029B, not the Intel register', () => {
    const h = fake([0, 0]);
    h.writeMsr(0, 0x611, 0x1111n);
    h.writeMsr(0, 0xc001029b, 0x2222n);
    const dev = new MsrDevice(h.msrPathTemplate);
    expect(
      packageCounters(new MsrEnergySource({ device: dev, cpus: readHostCpus(h.sysRoot), vendor: 'amd', sysRoot: h.sysRoot }).read()),
    ).toEqual(new Map([[0, 0x2222n]]));
    dev.close();
  });

  test('a missing device throws (the caller names the fix)', () => {
    const dev = new MsrDevice('/nonexistent/%u/msr');
    expect(() => new MsrEnergySource({ device: dev, cpus: [{ cpu: 0, pkg: 0 }], vendor: 'intel', sysRoot: '/nonexistent' }).read()).toThrow(
      /cannot open/,
    );
  });
});

describe('createEnergySource', () => {
  test('msr reads the host MSRs, with the unit of each package power unit register, and names them', () => {
    const h = fake([0, 1]);
    h.writeRapl({ powerUnit: 0xa1003n, energy: { 0: 0x100, 1: 0x200 } }); // ESU 16
    const dev = new MsrDevice(h.msrPathTemplate);
    const host = readHostInfoFor('msr', { paths: paths(h), device: dev, vendor: 'intel' });
    const src = createEnergySource('msr', { host, paths: paths(h), device: dev });
    expect(src).toBeInstanceOf(MsrEnergySource);
    expect(src.read()).toEqual([
      {
        pkg: 0,
        domain: 'package',
        energyUj: (0x100n * 1_000_000n) >> 16n,
        counter: { raw: 0x100n, range: 1n << 32n, unitJ: 2 ** -16 },
      },
      {
        pkg: 1,
        domain: 'package',
        energyUj: (0x200n * 1_000_000n) >> 16n,
        counter: { raw: 0x200n, range: 1n << 32n, unitJ: 2 ** -16 },
      },
    ]);
    expect(src.describe()).toMatch(
      /^energy counters read from RAPL MSRs: package 0x611 \(15\.26 µJ\); not read: core: MSR 0x639: cannot read MSR 0x639 on CPU 0: short read/,
    );
    dev.close();
  });

  test('synthetic counts in the unit host info gave every package, and opens no MSR', () => {
    const h = fake([0, 0, 1]);
    const dev = new MsrDevice('/nonexistent/%u/msr');
    const p = { ...paths(h), msrPathTemplate: '/nonexistent/%u/msr' };
    const host = readHostInfoFor('synthetic', { paths: p, device: dev, vendor: 'intel' });
    const src = createEnergySource('synthetic', { host, paths: p, device: dev });
    expect(src).toBeInstanceOf(SyntheticEnergySource);
    expect((src as SyntheticEnergySource).powerUnit).toBe(0xa0e03n);
    expect(src.read().map((r) => [r.pkg, r.counter.unitJ])).toEqual([
      [0, 2 ** -14],
      [1, 2 ** -14],
    ]);
    expect(src.describe()).toMatch(/^energy counters SYNTHESISED/);
    expect(dev.openFds()).toEqual([]);
  });

  test('only the msr kind reads MSRs', () => {
    expect(ENERGY_SOURCE_KINDS.filter(readsMsrs)).toEqual(['msr']);
  });

  test('a failed MSR read is an EnergyReadError that msrErrorWithHint still gives the fix of', () => {
    const dev = new MsrDevice('/nonexistent/%u/msr');
    let err: unknown;
    try {
      new MsrEnergySource({ device: dev, cpus: [{ cpu: 0, pkg: 0 }], vendor: 'intel', sysRoot: '/nonexistent' }).read();
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(EnergyReadError);
    expect((err as EnergyReadError).cause).toBeInstanceOf(MsrReadError);
    expect(msrErrorWithHint(err, 'use --energy-source synthetic').message).toMatch(
      /^cannot open \/nonexistent\/0\/msr: ENOENT: the MSR device does not exist; load the msr driver with 'modprobe msr'.*, or use --energy-source synthetic$/,
    );
  });
});

describe('readHostInfo', () => {
  test('Intel: power unit per package, limit and info when readable', () => {
    const h = fake([0, 1]);
    h.writePackageMsr(0, 0x606, 0xa0e03n);
    h.writePackageMsr(1, 0x606, 0xa1003n);
    // In a FakeHost file 0x610's high half shares bytes with 0x614's low half, so the values agree there.
    h.writePackageMsr(0, 0x610, 0x1e0_00fe8078n);
    h.writePackageMsr(0, 0x614, 0x1e0n);
    const dev = new MsrDevice(h.msrPathTemplate);
    const info = readHostInfo({ paths: paths(h), device: dev, vendor: 'intel' });
    expect(info.clkTck).toBeGreaterThan(0);
    expect(info.cpus).toEqual([
      { cpu: 0, pkg: 0 },
      { cpu: 1, pkg: 1 },
    ]);
    expect(info.packages[0]).toMatchObject({ pkg: 0, powerUnit: 0xa0e03n, powerLimit: 0x1e0_00fe8078n, powerInfo: 0x1e0n });
    expect(info.packages[1]!.powerUnit).toBe(0xa1003n);
    dev.close();
  });

  test('AMD: power unit from 0xC0010299, no Intel-only registers', () => {
    const h = fake([0]);
    h.writeMsr(0, 0xc0010299, 0xa1003n);
    h.writeMsr(0, 0x606, 0xffffn);
    const dev = new MsrDevice(h.msrPathTemplate);
    const info = readHostInfo({ paths: paths(h), device: dev, vendor: 'amd' });
    expect(info.packages).toEqual([{ pkg: 0, powerUnit: 0xa1003n }]);
    dev.close();
  });

  test('synthetic: the configured unit, no MSR touched; missing MSR names the fix', () => {
    const dev = new MsrDevice('/nonexistent/%u/msr');
    const h = fake([0, 0]);
    const p = { ...paths(h), msrPathTemplate: '/nonexistent/%u/msr' };
    expect(readHostInfoFor('synthetic', { paths: p, device: dev, vendor: 'intel' }).packages).toEqual([{ pkg: 0, powerUnit: 0xa0e03n }]);
    let err: unknown;
    try {
      readHostInfo({ paths: p, device: dev, vendor: 'intel' });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(MsrReadError);
    // The caller adds the fix (msr/errno-hints.ts) and its own alternative.
    expect(msrErrorWithHint(err, 'use --energy-source synthetic').message).toMatch(
      /^cannot open \/nonexistent\/0\/msr: ENOENT: the MSR device does not exist; load the msr driver with 'modprobe msr'.*, or use --energy-source synthetic$/,
    );
  });
});

describe('SyntheticEnergySource', () => {
  test('parses /proc/stat per CPU', () => {
    const m = parseProcStat('cpu  1 2 3 4\ncpu0 10 0 5 100 3 1 1 0 0 0\ncpu1 bad\nintr 5\n');
    expect(m.get(0)).toEqual({ busy: 17, total: 120 });
    expect(m.has(1)).toBe(false);
  });

  test('integrates idle power over measured time and wraps at 32 bits', () => {
    let t = 0n;
    const src = new SyntheticEnergySource({
      procRoot: '/proc',
      cpus: [{ cpu: 0, pkg: 0 }],
      idleW: 10,
      busyW: 0,
      start: 0xffffff00,
      clock: () => t,
    });
    t = 1_000_000_000n; // 1 s at 10 W = 10 J = 163840 units of 2^-14 J
    const v = packageCounters(src.read()).get(0)!;
    expect(v).toBe(BigInt((0xffffff00 + 163840) % 2 ** 32));
    expect(v).toBeLessThan(0xffffff00n); // wrapped
    t = 2_000_000_000n;
    expect(packageCounters(src.read()).get(0)).toBe(v + 163840n);
    expect(src.describe()).toMatch(/SYNTHESISED/);
  });

  test('grows faster under load than idle', () => {
    // The load comes from a stat file the test writes: the real host's load (other tests, QEMU guests
    // on 2 CPUs) cannot be made idle on demand.
    const h = fake([0, 0]);
    const procRoot = path.join(h.dir, 'proc');
    fs.mkdirSync(procRoot);
    // user nice system idle iowait irq softirq steal, per CPU
    const stat = (busy0: number, idle0: number, idle1: number) =>
      fs.writeFileSync(path.join(procRoot, 'stat'), `cpu  0 0 0 0\ncpu0 ${busy0} 0 0 ${idle0} 0 0 0 0\ncpu1 0 0 0 ${idle1} 0 0 0 0\n`);
    let t = 0n;
    stat(0, 0, 0);
    const src = new SyntheticEnergySource({ procRoot, cpus: readHostCpus(h.sysRoot), idleW: 0, busyW: 100, start: 0, clock: () => t });
    t = 300_000_000n;
    stat(0, 30, 30); // both CPUs idle for 0.3 s
    const idle = Number(packageCounters(src.read()).get(0)!);
    t = 600_000_000n;
    stat(30, 30, 60); // cpu0 busy, cpu1 idle: the package is half busy
    const busy = Number(packageCounters(src.read()).get(0)!) - idle;
    expect(busy).toBeGreaterThan(idle);
    expect(idle).toBe(0);
    expect(busy).toBe(Math.floor((100 * 0.5 * 0.3) / 2 ** -14)); // 15 J in 2^-14 J units
  });
});

describe('Sampler', () => {
  test('FakeHost MSRs + real /proc: energy, tasks of live pids only, one timestamp', () => {
    const h = fake([0, 0]);
    h.writeMsr(0, 0x611, 0x1234n);
    const dev = new MsrDevice(h.msrPathTemplate);
    const tasks = new ProcTaskReader('/proc');
    let t = 5n;
    const s = new Sampler(
      new MsrEnergySource({ device: dev, cpus: readHostCpus(h.sysRoot), vendor: 'intel', sysRoot: h.sysRoot }),
      tasks,
      () => t++,
    ).sample([process.pid, 0x7ffffffe, process.pid]);
    expect(s.tNs).toBe(5n);
    expect(t).toBe(6n);
    expect(s.energy).toEqual(new Map([[0, 0x1234n]]));
    expect([...s.tasks.keys()]).toEqual([process.pid]);
    expect(s.tasks.get(process.pid)!.get(process.pid)).toMatch(new RegExp(`^${process.pid} \\(`));
    tasks.close();
    dev.close();
  });

  test('an energy read failure throws instead of producing a half sample', () => {
    const dev = new MsrDevice('/nonexistent/%u/msr');
    const tasks = new ProcTaskReader('/proc');
    expect(() =>
      new Sampler(new MsrEnergySource({ device: dev, cpus: [{ cpu: 0, pkg: 0 }], vendor: 'intel', sysRoot: '/nonexistent' }), tasks).sample(
        [process.pid],
      ),
    ).toThrow();
    expect(tasks.openFds).toBe(0);
  });
});
