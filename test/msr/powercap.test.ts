/**
 * The powercap source on a fake tree in the kernel's layout: zones mapped to packages and domains,
 * a real counter range and its wrap, fds kept from construction, a missing driver, --domains, a
 * domain failing while the package goes on, and host info's description of the counter.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { createEnergySource, readHostInfoFor } from '../../src/energy/create.js';
import { EnergyReadError, type EnergyReading } from '../../src/energy/energy-source.js';
import { PowercapEnergySource, type PowercapSourceOptions } from '../../src/energy/powercap-source.js';
import { MsrDevice } from '../../src/msr/device.js';
import { readHostCpus } from '../../src/msr/topology.js';
import { FakeHost } from '../support/fake-host.js';

/** A Xeon's max_energy_range_uj (2^32 counts of 61 µJ). */
const MAX = 262143328850n;

const hosts: FakeHost[] = [];
const sources: PowercapEnergySource[] = [];
afterEach(() => {
  for (const s of sources.splice(0)) s.close();
  for (const h of hosts.splice(0)) h.cleanup();
});

type Zone = { id: string; name: string; uj?: bigint };

function host(zones: Zone[], packages = [0, 0, 1, 1]): FakeHost {
  const h = new FakeHost({ packages });
  hosts.push(h);
  h.writePowercap(zones.map((z) => ({ ...z, max: MAX, uj: z.uj ?? 1000n })));
  return h;
}

function source(h: FakeHost, o: Partial<PowercapSourceOptions> = {}): PowercapEnergySource {
  const s = new PowercapEnergySource({ sysRoot: h.sysRoot, cpus: readHostCpus(h.sysRoot), vendor: 'intel', ...o });
  sources.push(s);
  return s;
}

const slots = (rs: readonly EnergyReading[]): string[] => rs.map((r) => `${r.pkg} ${r.domain}`);
const slot = (rs: readonly EnergyReading[], pkg: number, domain: string): EnergyReading =>
  rs.find((r) => r.pkg === pkg && r.domain === domain)!;

const TWO_PACKAGES: Zone[] = [
  { id: '0', name: 'package-0' },
  { id: '0:0', name: 'dram' },
  { id: '1', name: 'package-1' },
  { id: '1:0', name: 'dram' },
];

describe('powercap energy source', () => {
  test('maps zones to packages by their name, sub-zones to their parent, psys to the platform, and skips what it does not read', () => {
    const h = host([
      { id: '0', name: 'package-1' }, // the zone index is not the package id
      { id: '0:0', name: 'core' },
      { id: '0:1', name: 'gpu-thing' },
      { id: '1', name: 'psys' },
      { id: '2', name: 'package-0' },
      { id: '2:0', name: 'dram' },
    ]);
    const s = source(h);
    expect(s.packages).toEqual([0, 1]);
    expect(s.domains).toEqual(['package', 'core', 'dram', 'psys']);
    expect(slots(s.read())).toEqual(['0 package', '0 dram', '0 psys', '1 package', '1 core']);
    expect(s.absent).toEqual([
      { domain: 'intel-rapl:0:1', why: 'sub-zone "gpu-thing" is not core, uncore or dram' },
      { domain: 'core', why: `no core zone for package 0 in ${h.sysRoot}/class/powercap` },
      { domain: 'uncore', why: `no uncore zone for package 0 in ${h.sysRoot}/class/powercap` },
      { domain: 'uncore', why: `no uncore zone for package 1 in ${h.sysRoot}/class/powercap` },
      { domain: 'dram', why: `no dram zone for package 1 in ${h.sysRoot}/class/powercap` },
    ]);
    expect(s.describe()).toMatch(
      /^energy counters read from powercap \(.*\/class\/powercap, µJ\): package \(intel-rapl:2, intel-rapl:0\), core \(intel-rapl:0:0\), dram \(intel-rapl:2:0\), psys \(intel-rapl:1\); not read: /,
    );
  });

  test('a domain is read where its zone is: a package without it simply has no reading of it', () => {
    const s = source(
      host([
        { id: '0', name: 'package-0' },
        { id: '0:0', name: 'dram' },
        { id: '1', name: 'package-1' },
      ]),
    );
    expect(slots(s.read())).toEqual(['0 package', '0 dram', '1 package']);
  });

  test('on AMD the core zone is not read: the kernel counts one core in it', () => {
    const s = source(
      host(
        [
          { id: '0', name: 'package-0' },
          { id: '0:0', name: 'core' },
        ],
        [0, 0],
      ),
      { vendor: 'amd' },
    );
    expect(s.domains).toEqual(['package']);
    expect(s.absent[0]).toEqual({ domain: 'intel-rapl:0:0', why: 'on AMD the core zone counts one core only' });
  });

  test('energy_uj wraps to 0 after max_energy_range_uj, and the energy goes on growing by what was used', () => {
    const h = host(
      [
        { id: '0', name: 'package-0', uj: MAX - 100n },
        { id: '0:0', name: 'dram', uj: MAX },
      ],
      [0],
    );
    const s = source(h);
    const a = s.read();
    expect(slot(a, 0, 'package').counter).toEqual({ raw: MAX - 100n, range: MAX + 1n, unitJ: 1e-6 });
    expect(slot(a, 0, 'package').energyUj).toBe(MAX - 100n);
    h.addZoneEnergy('0', 300n);
    h.addZoneEnergy('0:0', 1n); // max -> 0
    const b = s.read();
    expect(slot(b, 0, 'package').counter.raw).toBe(199n);
    expect(slot(b, 0, 'package').energyUj - slot(a, 0, 'package').energyUj).toBe(300n);
    expect(slot(b, 0, 'dram').counter.raw).toBe(0n);
    expect(slot(b, 0, 'dram').energyUj - slot(a, 0, 'dram').energyUj).toBe(1n);
  });

  test('opens each energy_uj once, at construction, and reads that fd from then on (a root-only file outlives the privilege drop)', () => {
    const h = host(TWO_PACKAGES);
    const opened: string[] = [];
    const s = source(h, {
      open: (f) => {
        opened.push(path.relative(h.sysRoot, f));
        return fs.openSync(f, 'r');
      },
    });
    expect(opened).toEqual([
      'class/powercap/intel-rapl:0/energy_uj',
      'class/powercap/intel-rapl:0:0/energy_uj',
      'class/powercap/intel-rapl:1/energy_uj',
      'class/powercap/intel-rapl:1:0/energy_uj',
    ]);
    h.addZoneEnergy('1', 5n);
    for (const id of ['0', '0:0', '1', '1:0']) fs.unlinkSync(path.join(h.powercapZoneDir(id), 'energy_uj'));
    expect(slot(s.read(), 1, 'package').counter.raw).toBe(1005n);
  });

  test('a host without the powercap driver fails naming the modprobe that loads it', () => {
    const h = new FakeHost({ packages: [0] });
    hosts.push(h);
    expect(() => source(h)).toThrow(EnergyReadError);
    expect(() => source(h)).toThrow(
      /^cannot list the powercap zones in .*\/class\/powercap: ENOENT; load the powercap RAPL driver with 'modprobe intel_rapl_msr'/,
    );
    const h2 = host([{ id: '0', name: 'package-0' }]); // package 1 has no zone
    expect(() => source(h2)).toThrow(
      /^cannot read package 1's energy from powercap: no package-1 zone for package 1 in .*; load the powercap RAPL driver/,
    );
  });

  test('--domains reads the package and the domains named, and refuses one the host does not have', () => {
    const h = host([...TWO_PACKAGES, { id: '2', name: 'psys' }]);
    expect(source(h, { domains: ['psys'] }).domains).toEqual(['package', 'psys']);
    expect(() => source(h, { domains: ['core'] })).toThrow(
      /^cannot read the core domain of package 0: no core zone for package 0 in .*; leave core out of --domains$/,
    );
  });

  test('a domain whose zone fails mid-run throws an EnergyReadError naming it that carries the package readings', () => {
    const h = host(TWO_PACKAGES);
    const s = source(h);
    s.read();
    const file = path.join(h.powercapZoneDir('1:0'), 'energy_uj');
    fs.writeFileSync(file, 'garbage\n');
    h.addZoneEnergy('1', 10n);
    let err: unknown;
    try {
      s.read();
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(EnergyReadError);
    const e = err as EnergyReadError;
    expect(e.message).toBe(
      `cannot read the dram domain: cannot read ${h.sysRoot}/class/powercap/intel-rapl:1:0/energy_uj: "garbage" is not a count of µJ; the package and other domains go on`,
    );
    expect(e.domains).toEqual(['dram']);
    expect(slots(e.readings!)).toEqual(['0 package', '0 dram', '1 package']);
    expect(slot(e.readings!, 1, 'package').counter.raw).toBe(1010n);
    h.setZoneEnergy('1:0', 1500n);
    expect(slot(s.read(), 1, 'dram').energyUj).toBe(1500n);
  });

  test('energy_uj is read with white space around its digits and exactly past 2^53; a sign or a 21st digit is refused', () => {
    const h = host(TWO_PACKAGES);
    const s = source(h);
    const file = path.join(h.powercapZoneDir('1:0'), 'energy_uj');
    const dram = () => slot(s.read(), 1, 'dram').counter.raw;
    fs.writeFileSync(file, ' \t1234\r\n');
    expect(dram()).toBe(1234n);
    fs.writeFileSync(file, '9007199254740993\n'); // 2^53 + 1: no float64 holds it
    expect(dram()).toBe(9007199254740993n % (MAX + 1n));
    for (const bad of ['-5\n', '+5\n', '123456789012345678901\n', '12 34\n', '\n']) {
      fs.writeFileSync(file, bad);
      expect(() => s.read(), JSON.stringify(bad)).toThrow(`${JSON.stringify(bad.trim())} is not a count of µJ`);
    }
  });

  test('host info describes each package counter (µJ, range max + 1) and the factory builds the source', () => {
    const h = host(TWO_PACKAGES);
    const device = new MsrDevice(h.msrPathTemplate);
    const info = readHostInfoFor('powercap', { paths: h.hostPaths(), device, vendor: 'intel' });
    expect(info.packages.map((p) => [p.pkg, p.counter])).toEqual([
      [0, { range: MAX + 1n, unitJ: 1e-6 }],
      [1, { range: MAX + 1n, unitJ: 1e-6 }],
    ]);
    expect(info.packages[0]!.powerUnit).toBe(0xa0e03n);
    const s = createEnergySource('powercap', { host: info, paths: h.hostPaths(), device });
    expect(s).toBeInstanceOf(PowercapEnergySource);
    s.close();
    expect(device.openFds()).toEqual([]); // no MSR is read
  });

  test('a multi-die package sums its dies (package-N-die-M and their sub-zones) into one counter that wraps at their shared range', () => {
    const h = host(
      [
        { id: '0', name: 'package-0-die-0', uj: MAX - 100n },
        { id: '0:0', name: 'dram', uj: 10n },
        { id: '1', name: 'package-0-die-1', uj: 500n },
        { id: '1:0', name: 'dram', uj: 20n },
      ],
      [0, 0],
    );
    const s = source(h);
    expect(s.packages).toEqual([0]);
    expect(s.domains).toEqual(['package', 'dram']);
    expect(s.describe()).toMatch(/package \(intel-rapl:0\+intel-rapl:1\), dram \(intel-rapl:0:0\+intel-rapl:1:0\)/);
    expect(s.domainCounters).toEqual([{ pkg: 0, domain: 'dram', range: MAX + 1n, unitJ: 1e-6 }]);
    const a = s.read();
    expect(slot(a, 0, 'package').counter.raw).toBe(MAX - 100n + 500n - (MAX + 1n)); // the sum, wrapped at the shared range
    expect(slot(a, 0, 'dram').counter.raw).toBe(30n);
    h.addZoneEnergy('0', 300n); // die 0 wraps
    h.addZoneEnergy('1', 50n);
    h.addZoneEnergy('1:0', 7n);
    const b = s.read();
    expect(slot(b, 0, 'package').energyUj - slot(a, 0, 'package').energyUj).toBe(350n);
    expect(slot(b, 0, 'dram').energyUj - slot(a, 0, 'dram').energyUj).toBe(7n);
  });

  test('a multi-die package whose dies wrap at different ranges is refused, naming the zones', () => {
    const h = new FakeHost({ packages: [0, 0] });
    hosts.push(h);
    h.writePowercap([
      { id: '0', name: 'package-0-die-0', max: MAX, uj: 1n },
      { id: '1', name: 'package-0-die-1', max: MAX - 1n, uj: 1n },
    ]);
    expect(() => source(h)).toThrow(/its dies' zones \(intel-rapl:0, intel-rapl:1\) wrap at different max_energy_range_uj/);
  });
});
