/**
 * The RAPL domains of the MSR source on fake MSR files: which are found (a register that cannot be
 * read or reads 0 is absent), --domains, the unit of each, a domain that fails while the package goes
 * on, and AMD's per-core counters summed per package.
 */
import fs from 'node:fs';
import { afterEach, describe, expect, test } from 'vitest';
import { EnergyReadError, type EnergyReading } from '../../src/energy/energy-source.js';
import { DRAM_FIXED_UNIT_J } from '../../src/energy/msr-domains.js';
import { MsrEnergySource, type MsrSourceOptions } from '../../src/energy/msr-source.js';
import { MsrDevice } from '../../src/msr/device.js';
import {
  MSR_AMD_CORE_ENERGY_STATUS,
  MSR_DRAM_ENERGY_STATUS,
  MSR_PLATFORM_ENERGY_STATUS,
  MSR_PP0_ENERGY_STATUS,
  MSR_PP1_ENERGY_STATUS,
} from '../../src/msr/registers.js';
import { readHostCpus } from '../../src/msr/topology.js';
import { FakeHost } from '../support/fake-host.js';

const hosts: FakeHost[] = [];
const devices: MsrDevice[] = [];
afterEach(() => {
  for (const d of devices.splice(0)) d.close();
  for (const h of hosts.splice(0)) h.cleanup();
});

/** An Intel host of two packages (ESU 14) whose package counters and the given domain registers count from 1000. */
function intelHost(msrs: number[]): FakeHost {
  const h = new FakeHost({ packages: [0, 0, 1, 1] });
  hosts.push(h);
  h.writeRapl({ powerUnit: 0xa0e03n, energy: { 0: 1000, 1: 1000 } });
  for (const pkg of [0, 1]) for (const msr of msrs) h.setCounter(h.cpusOf(pkg), msr, 1000);
  return h;
}

function source(h: FakeHost, o: Partial<MsrSourceOptions> = {}): MsrEnergySource {
  const device = new MsrDevice(h.msrPathTemplate);
  devices.push(device);
  return new MsrEnergySource({ device, cpus: readHostCpus(h.sysRoot), vendor: 'intel', sysRoot: h.sysRoot, ...o });
}

const slot = (rs: readonly EnergyReading[], pkg: number, domain: string): EnergyReading | undefined =>
  rs.find((r) => r.pkg === pkg && r.domain === domain);

describe('MSR energy domains', () => {
  test('probing finds the domains whose registers count and leaves out one that reads 0 and one past the end of the registers', () => {
    const h = intelHost([MSR_PP0_ENERGY_STATUS, MSR_PP1_ENERGY_STATUS]);
    h.setCounter(h.cpusOf(0), MSR_DRAM_ENERGY_STATUS, 0); // present in the file, never counted: absent, as Linux decides
    const s = source(h);
    expect(s.domains).toEqual(['package', 'core', 'uncore']);
    expect(s.absent.map((a) => a.domain)).toEqual(['dram', 'psys']);
    expect(s.absent[0]!.why).toBe('MSR 0x619 reads 0 on package 0 (not counting)');
    expect(s.absent[1]!.why).toMatch(/^MSR 0x64d: cannot read MSR 0x64d on CPU 0: short read/);
    expect(s.describe()).toBe(
      'energy counters read from RAPL MSRs: package 0x611 (61.04 µJ), core 0x639 (61.04 µJ), uncore 0x641 (61.04 µJ); ' +
        `not read: dram: ${s.absent[0]!.why}, psys: ${s.absent[1]!.why}`,
    );
    expect(s.read().map((r) => `${r.pkg} ${r.domain}`)).toEqual(['0 package', '0 core', '0 uncore', '1 package', '1 core', '1 uncore']);
  });

  test('--domains reads the package and the domains named, and refuses a domain the host does not have', () => {
    const h = intelHost([MSR_PP0_ENERGY_STATUS, MSR_DRAM_ENERGY_STATUS]);
    const s = source(h, { domains: ['dram'] });
    expect(s.domains).toEqual(['package', 'dram']);
    expect(s.absent).toEqual([
      { domain: 'core', why: 'not in --domains' },
      { domain: 'uncore', why: 'not in --domains' },
      { domain: 'psys', why: 'not in --domains' },
    ]);
    expect(() => source(h, { domains: ['dram', 'uncore'] })).toThrow(
      /^cannot read the uncore domain: MSR 0x641: cannot read MSR 0x641 on CPU 0: .*; leave uncore out of --domains$/,
    );
  });

  test('DRAM counts in 15.3 µJ on the server models Linux lists, in the ESU elsewhere; PSYS in joules on Sapphire Rapids', () => {
    const h = intelHost([MSR_DRAM_ENERGY_STATUS, MSR_PLATFORM_ENERGY_STATUS]);
    const unit = (model: number, domain: string): number =>
      slot(source(h, { model: { family: 6, model } }).read(), 0, domain)!.counter.unitJ;
    expect(unit(0x55, 'dram')).toBe(DRAM_FIXED_UNIT_J); // Skylake-X
    expect(unit(0x3f, 'dram')).toBe(DRAM_FIXED_UNIT_J); // Haswell-X
    expect(unit(0x8f, 'dram')).toBe(2 ** -14); // Sapphire Rapids: the ESU since Linux 6.1
    expect(unit(0x9e, 'dram')).toBe(2 ** -14); // a client part
    expect(unit(0x8f, 'psys')).toBe(1);
    expect(unit(0x55, 'psys')).toBe(2 ** -14);
    const r = slot(source(h, { model: { family: 6, model: 0x55 } }).read(), 1, 'dram')!;
    expect(r.energyUj).toBe(BigInt(Math.floor(1000 * 15.3))); // 1000 counts of 15.3 µJ
  });

  test('PSYS, platform-wide, is read once, under the lowest package', () => {
    const h = intelHost([MSR_PLATFORM_ENERGY_STATUS]);
    const rs = source(h).read();
    expect(rs.map((r) => `${r.pkg} ${r.domain}`)).toEqual(['0 package', '0 psys', '1 package']);
  });

  test('a domain that fails mid-run throws an EnergyReadError naming it that carries every other reading, and its energy across the gap counts once it is back', () => {
    const h = intelHost([MSR_PP0_ENERGY_STATUS, MSR_PLATFORM_ENERGY_STATUS]);
    const s = source(h);
    const before = slot(s.read(), 1, 'core')!;
    // package 1 is read through CPU 2: cut its file inside PP0 (0x639), keeping the package counter (0x611)
    const file = h.msrPath(2);
    const saved = fs.readFileSync(file);
    fs.truncateSync(file, MSR_PP0_ENERGY_STATUS + 1);
    h.addEnergy(1, 7);
    let err: unknown;
    try {
      s.read();
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(EnergyReadError);
    const e = err as EnergyReadError;
    expect(e.message).toMatch(
      /^cannot read the core domain: cannot read MSR 0x639 on CPU 2: short read \(1 bytes\): .*MSR 0x639 \(Intel core \(PP0\) energy status\); .*; the package and other domains go on$/,
    );
    expect(e.domains).toEqual(['core']);
    expect(e.readings!.map((r) => `${r.pkg} ${r.domain}`)).toEqual(['0 package', '0 core', '0 psys', '1 package']);
    expect(slot(e.readings!, 1, 'package')!.counter.raw).toBe(1007n);
    fs.writeFileSync(file, saved);
    h.addCounter(h.cpusOf(1), MSR_PP0_ENERGY_STATUS, 0x1000); // it counted on while it could not be read
    const after = slot(s.read(), 1, 'core')!;
    expect(after.counter.raw).toBe(1000n + 0x1000n);
    expect(after.energyUj - before.energyUj).toBe((0x1000n * 1_000_000n) >> 14n);
  });
});

describe('AMD per-core energy', () => {
  /** One package of two SMT cores (CPUs 0,1 and 2,3), ESU 16; the per-core counters of 0 and 2. */
  function amdHost(): FakeHost {
    const h = new FakeHost({ packages: [0, 0, 0, 0], coreIds: [0, 0, 1, 1] });
    hosts.push(h);
    h.writeRapl({ vendor: 'amd', powerUnit: 0xa1003n });
    return h;
  }
  const amd = (h: FakeHost): MsrEnergySource => source(h, { vendor: 'amd' });

  test('the core domain is the sum of the package cores counters mod 2^32, each read through its first CPU, a core wrap counted as one counter wrap', () => {
    const h = amdHost();
    // 0xC001029A sits one byte below the package counter: on CPU 0 their bytes overlap, so only core 1 (CPU 2) moves here
    h.setCounter([0], MSR_AMD_CORE_ENERGY_STATUS, 0x10);
    h.setEnergy(0, 0x100, 'amd'); // read through CPU 0, whose core counter keeps its low byte only
    h.setCounter([2], MSR_AMD_CORE_ENERGY_STATUS, 0xffffff00); // after: CPU 2's package counter (never read) is the one overwritten
    const s = amd(h);
    expect(s.domains).toEqual(['package', 'core']);
    expect(s.describe()).toMatch(/core 0xc001029a per core \(15\.26 µJ\)/);
    const a = slot(s.read(), 0, 'core')!;
    expect(a.counter.range).toBe(1n << 32n);
    expect(a.counter.raw < 1n << 32n).toBe(true);
    h.addCounter([2], MSR_AMD_CORE_ENERGY_STATUS, 0x200); // core 1 wraps
    const b = slot(s.read(), 0, 'core')!;
    expect((b.counter.raw - a.counter.raw + (1n << 32n)) % (1n << 32n)).toBe(0x200n);
    expect(b.energyUj).toBe(((a.counter.raw + 0x200n) * 1_000_000n) >> 16n); // counted on from the first read's value
    expect(devices[0]!.isOpen(1)).toBe(false); // SMT siblings are not read
    expect(devices[0]!.isOpen(3)).toBe(false);
  });

  test('the core domain is absent when every core counter reads 0', () => {
    const h = amdHost();
    h.setEnergy(0, 0x100, 'amd'); // covers bytes of CPU 0's core counter: write it after, as 0
    h.setCounter([0], MSR_AMD_CORE_ENERGY_STATUS, 0);
    h.setCounter([2], MSR_AMD_CORE_ENERGY_STATUS, 0);
    const s = amd(h);
    expect(s.domains).toEqual(['package']);
    expect(s.absent).toEqual([{ domain: 'core', why: 'MSR 0xc001029a reads 0 on every core (not counting)' }]);
  });
});
