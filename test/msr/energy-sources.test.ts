/**
 * The EnergySource contract (energy-source-contract.ts) over every source kind (energy/kinds.ts): MSR
 * files for Intel and AMD, built by the factory as the daemon and record build them, and the synthetic
 * source. The table is keyed by kind, so a new kind does not compile until it has a run here.
 */
import fs from 'node:fs';
import path from 'node:path';
import { createEnergySource, readHostInfoFor } from '../../src/energy/create.js';
import type { EnergySourceKind } from '../../src/energy/kinds.js';
import { SyntheticEnergySource } from '../../src/energy/synthetic-source.js';
import { MsrDevice } from '../../src/msr/device.js';
import {
  MSR_AMD_PKG_ENERGY_STATUS,
  MSR_AMD_RAPL_POWER_UNIT,
  MSR_PKG_ENERGY_STATUS,
  MSR_RAPL_POWER_UNIT,
  MSR_DRAM_ENERGY_STATUS,
  MSR_PLATFORM_ENERGY_STATUS,
  MSR_PP0_ENERGY_STATUS,
  MSR_PP1_ENERGY_STATUS,
} from '../../src/msr/registers.js';
import { readHostCpus } from '../../src/msr/topology.js';
import type { Vendor } from '../../src/model/host.js';
import { FakeHost, TWO_PACKAGE_ZONES } from '../support/fake-host.js';
import { energySourceContract, START_COUNTER, type SourceUnderTest } from './energy-source-contract.js';

const PACKAGES = [0, 0, 1, 1]; // two packages of two CPUs

/** The other domains' registers per vendor, as the contract runs them (AMD's core is per core). */
const INTEL_DOMAIN_MSRS = [MSR_PP0_ENERGY_STATUS, MSR_PP1_ENERGY_STATUS, MSR_DRAM_ENERGY_STATUS, MSR_PLATFORM_ENERGY_STATUS];

/** Hides the registers `msrs` of a CPU from an fd already open on its file (the source probed at construction), then puts them back. */
function hideRegisters(file: string, msrs: number[]): { breakIt(): void; repair(): void } {
  let saved: [number, Buffer][] = [];
  const io = (mode: string, f: (fd: number) => void): void => {
    const fd = fs.openSync(file, mode);
    try {
      f(fd);
    } finally {
      fs.closeSync(fd);
    }
  };
  return {
    breakIt: () => {
      io('r', (fd) => {
        saved = msrs.map((msr) => {
          const b = Buffer.alloc(8);
          fs.readSync(fd, b, 0, 8, msr);
          return [msr, b];
        });
      });
      fs.truncateSync(file, 0);
    },
    repair: () => io('r+', (fd) => saved.forEach(([msr, b]) => fs.writeSync(fd, b, 0, 8, msr))),
  };
}

/**
 * Intel: every domain, on a Skylake-X (family 6 model 0x55), whose DRAM counts in 15.3 µJ. AMD: the
 * package alone. Its per-core counter (0xC001029A) is one byte below the package's (0xC001029B), so
 * in a file read at offset = MSR the two overlap on the CPU both are read through: the per-core sum
 * has tests of its own (msr-domains.test.ts).
 */
function msrSource(vendor: Vendor): SourceUnderTest {
  const amd = vendor === 'amd';
  const fake = new FakeHost({ packages: PACKAGES });
  fake.writeRapl({ vendor, powerUnit: 0xa0e03n, energy: { 0: START_COUNTER, 1: START_COUNTER } });
  const counters: [number[], number][] = amd
    ? []
    : [0, 1].flatMap((pkg) => INTEL_DOMAIN_MSRS.map((msr): [number[], number] => [fake.cpusOf(pkg), msr]));
  for (const [cpus, msr] of counters) fake.setCounter(cpus, msr, START_COUNTER);
  const paths = fake.hostPaths();
  const infoDevice = new MsrDevice(fake.msrPathTemplate);
  const host = readHostInfoFor('msr', { paths, device: infoDevice, vendor });
  infoDevice.close();
  const device = new MsrDevice(fake.msrPathTemplate);
  // AMD: package only (domains: []), as its core counter overlaps the package's in these files
  const source = createEnergySource('msr', { host, paths, device, model: { family: 6, model: 0x55 }, ...(amd ? { domains: [] } : {}) });
  // The source reads package 1 through its first CPU: hiding that file's registers breaks it.
  const unitMsr = amd ? MSR_AMD_RAPL_POWER_UNIT : MSR_RAPL_POWER_UNIT;
  const hidden = hideRegisters(fake.msrPath(2), [
    unitMsr,
    amd ? MSR_AMD_PKG_ENERGY_STATUS : MSR_PKG_ENERGY_STATUS,
    ...(amd ? [] : INTEL_DOMAIN_MSRS),
  ]);
  return {
    source,
    packages: [0, 1],
    domains: amd ? ['package'] : ['package', 'core', 'uncore', 'dram', 'psys'],
    tolerance: 0,
    counter: () => ({ range: 1n << 32n, start: BigInt(START_COUNTER) }),
    advance: (units) => {
      fake.addEnergy(0, units, vendor);
      fake.addEnergy(1, units, vendor);
      for (const [cpus, msr] of counters) fake.addCounter(cpus, msr, units);
    },
    ...hidden,
    cleanup: () => {
      device.close();
      fake.cleanup();
    },
  };
}

function syntheticSource(): SourceUnderTest {
  const fake = new FakeHost({ packages: PACKAGES });
  const procRoot = path.join(fake.dir, 'proc');
  fs.mkdirSync(procRoot);
  const stat = path.join(procRoot, 'stat');
  // Idle CPUs that never change: energy is idleW x time alone, and time is the injected clock.
  fs.writeFileSync(stat, 'cpu  0 0 0 0\ncpu0 0 0 0 100 0 0 0 0\ncpu1 0 0 0 100 0 0 0 0\ncpu2 0 0 0 100 0 0 0 0\ncpu3 0 0 0 100 0 0 0 0\n');
  let t = 0n;
  const idleW = 1;
  const unitJ = 2 ** -14; // power unit 0xa0e03: ESU 14
  // Built directly rather than by createEnergySource: the contract needs its clock and watts.
  const source = new SyntheticEnergySource({
    procRoot,
    cpus: readHostCpus(fake.sysRoot),
    idleW,
    busyW: 0,
    powerUnit: 0xa0e03n,
    start: START_COUNTER,
    clock: () => t,
  });
  return {
    source,
    packages: [0, 1],
    domains: ['package'],
    counter: () => ({ range: 1n << 32n, start: BigInt(START_COUNTER) }),
    tolerance: 1,
    advance: (units) => {
      t += BigInt(Math.round(((units * unitJ) / idleW) * 1e9));
    },
    breakIt: () => fs.renameSync(stat, `${stat}.gone`),
    repair: () => fs.renameSync(`${stat}.gone`, stat),
    cleanup: () => fake.cleanup(),
  };
}

/**
 * A powercap tree of two packages as the kernel lays it out (TWO_PACKAGE_ZONES). Counters wrap after
 * 2^32 - 1 µJ here, so the contract's wrap comes early; a real range has its own test (powercap.test.ts).
 */
function powercapSource(): SourceUnderTest {
  const fake = new FakeHost({ packages: PACKAGES });
  const max = (1n << 32n) - 1n;
  const uj = BigInt(START_COUNTER);
  fake.writePowercap(TWO_PACKAGE_ZONES.map((z) => ({ ...z, max, uj })));
  const paths = fake.hostPaths();
  const device = new MsrDevice(fake.msrPathTemplate);
  const host = readHostInfoFor('powercap', { paths, device, vendor: 'intel' });
  const source = createEnergySource('powercap', { host, paths, device });
  // Package 1's zone: emptying its energy_uj (the fd stays open on it) breaks the read.
  const file = path.join(fake.powercapZoneDir('2'), 'energy_uj');
  let saved = '';
  return {
    source,
    packages: [0, 1],
    domains: ['package', 'core', 'uncore', 'dram', 'psys'],
    tolerance: 0,
    counter: () => ({ range: 1n << 32n, start: uj }),
    advance: (units) => {
      for (const z of TWO_PACKAGE_ZONES) fake.addZoneEnergy(z.id, BigInt(units));
    },
    breakIt: () => {
      saved = fs.readFileSync(file, 'utf8');
      fs.writeFileSync(file, '');
    },
    repair: () => fs.writeFileSync(file, saved),
    cleanup: () => {
      source.close();
      device.close();
      fake.cleanup();
    },
  };
}

const RUNS: { readonly [K in EnergySourceKind]: [string, () => SourceUnderTest][] } = {
  msr: [
    ['MSR files, Intel (0x611)', () => msrSource('intel')],
    ['MSR files, AMD (0xC001029B)', () => msrSource('amd')],
  ],
  powercap: [['powercap zones (intel-rapl:N, intel-rapl:N:M)', powercapSource]],
  synthetic: [['synthetic, from /proc/stat load', syntheticSource]],
};

for (const runs of Object.values(RUNS)) for (const [name, make] of runs) energySourceContract(name, make);
