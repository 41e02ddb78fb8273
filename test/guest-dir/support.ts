/** The guest-directory tests' fake host: one package whose package, core, DRAM and PSYS counters count. */
import { MSR_DRAM_ENERGY_STATUS, MSR_PLATFORM_ENERGY_STATUS, MSR_PP0_ENERGY_STATUS } from '../../src/msr/registers.js';
import { FakeHost } from '../support/fake-host.js';

/**
 * A fake host of two CPUs in package 0, its package counter adding `packageUnits` and core, DRAM and
 * PSYS `domainUnits` each every 20 ms (ESU 14: 61 µJ a unit); `cleanups` gets its stop and removal.
 */
export function countingHost(cleanups: (() => unknown)[], packageUnits: number, domainUnits: number): FakeHost {
  const fake = new FakeHost({ packages: [0, 0] });
  cleanups.push(() => fake.cleanup());
  fake.writeRapl({ powerUnit: 0xa0e03n, energy: { 0: 1000 } });
  const domains = [MSR_PP0_ENERGY_STATUS, MSR_DRAM_ENERGY_STATUS, MSR_PLATFORM_ENERGY_STATUS];
  for (const msr of domains) fake.setCounter(fake.cpusOf(0), msr, 1000);
  const pump = setInterval(() => {
    fake.addEnergy(0, packageUnits);
    for (const msr of domains) fake.addCounter(fake.cpusOf(0), msr, domainUnits);
  }, 20);
  cleanups.push(() => clearInterval(pump));
  return fake;
}
