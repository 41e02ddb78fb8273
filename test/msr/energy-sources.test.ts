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
import { readHostCpus } from '../../src/msr/topology.js';
import type { Vendor } from '../../src/ratio/types.js';
import { FakeHost } from '../support/fake-host.js';
import { energySourceContract, START_COUNTER, type SourceUnderTest } from './energy-source-contract.js';

const PACKAGES = [0, 0, 1, 1]; // two packages of two CPUs

function msrSource(vendor: Vendor): SourceUnderTest {
  const fake = new FakeHost({ packages: PACKAGES });
  fake.writeRapl({ vendor, powerUnit: 0xa0e03n, energy: { 0: START_COUNTER, 1: START_COUNTER } });
  const paths = fake.hostPaths();
  // Host info through a device of its own: the source's device opens nothing before its first read,
  // so hiding a file breaks that read (an fd once open outlives its file's name).
  const infoDevice = new MsrDevice(fake.msrPathTemplate);
  const host = readHostInfoFor('msr', { paths, device: infoDevice, vendor });
  infoDevice.close();
  const device = new MsrDevice(fake.msrPathTemplate);
  const source = createEnergySource('msr', { host, paths, device });
  // The source reads package 1 through CPU 2, its first CPU: hiding that file breaks it.
  const file = fake.msrPath(2);
  return {
    source,
    packages: [0, 1],
    tolerance: 0,
    advance: (units) => {
      fake.addEnergy(0, units, vendor);
      fake.addEnergy(1, units, vendor);
    },
    breakIt: () => fs.renameSync(file, `${file}.gone`),
    repair: () => fs.renameSync(`${file}.gone`, file),
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
  const source = new SyntheticEnergySource({ procRoot, cpus: readHostCpus(fake.sysRoot), idleW, busyW: 0, powerUnit: 0xa0e03n, start: START_COUNTER, clock: () => t });
  return {
    source,
    packages: [0, 1],
    tolerance: 1,
    advance: (units) => {
      t += BigInt(Math.round(((units * unitJ) / idleW) * 1e9));
    },
    breakIt: () => fs.renameSync(stat, `${stat}.gone`),
    repair: () => fs.renameSync(`${stat}.gone`, stat),
    cleanup: () => fake.cleanup(),
  };
}

const RUNS: { readonly [K in EnergySourceKind]: [string, () => SourceUnderTest][] } = {
  msr: [
    ['MSR files, Intel (0x611)', () => msrSource('intel')],
    ['MSR files, AMD (0xC001029B)', () => msrSource('amd')],
  ],
  synthetic: [['synthetic, from /proc/stat load', syntheticSource]],
};

for (const runs of Object.values(RUNS)) for (const [name, make] of runs) energySourceContract(name, make);
