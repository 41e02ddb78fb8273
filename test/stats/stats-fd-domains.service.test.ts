/**
 * The other RAPL domains in the statistics files, on the daemon's own assembly over a fake host whose
 * core (PP0), DRAM and platform (PSYS) registers count beside the package's (uncore's does not: the
 * host does not have it), a real Unix socket and a real spinning child as the VM. What the files say
 * is held to the engine's rules (docs/ratio.md "Other RAPL domains"): a domain is split like the
 * package, so a VM gets the same share of each domain's energy as of the package's, and per domain
 * the VMs' energy and the unattributed energy add up to the host's.
 */
import fs from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';
import { V2Client } from '../../src/client/v2-client.js';
import { StatsReader, type StatsSample } from '../../src/client/stats-reader.js';
import { MSR_DRAM_ENERGY_STATUS, MSR_PLATFORM_ENERGY_STATUS, MSR_PP0_ENERGY_STATUS } from '../../src/msr/registers.js';
import { startChild, startHarness, threadsOf, until, type Harness } from '../v2/harness.js';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});
/** A spinning child gets a tick only now and then on a loaded 2-core host: waits for its energy allow this long. */
const LOADED_HOST_MS = 15_000;

/** Per addition, the units each register counts: the domains in fixed proportions of the package. */
const UNITS = { pkg: 8000, core: 4000, dram: 2000, psys: 12000 };

/**
 * Adds energy every 20 ms to the package and the three domains in one synchronous step: the sampler
 * (in this process) reads them all between two steps, so every interval's domain energy is in the
 * same proportion to its package energy.
 */
function keepAddingEnergy(h: Harness): void {
  const cpus = h.fake.cpusOf(0);
  const t = setInterval(() => {
    h.addEnergy(UNITS.pkg);
    h.fake.addCounter(cpus, MSR_PP0_ENERGY_STATUS, UNITS.core);
    h.fake.addCounter(cpus, MSR_DRAM_ENERGY_STATUS, UNITS.dram);
    h.fake.addCounter(cpus, MSR_PLATFORM_ENERGY_STATUS, UNITS.psys);
  }, 20);
  cleanups.push(() => clearInterval(t));
}

const num = (r: StatsReader, s: StatsSample, name: string): number[] => {
  const v = r.values(s, name);
  if (v === undefined) throw new Error(`the file has no ${name}`);
  return v.map(Number);
};

/** a / b == c / d, each of a..d floored to a µJ (or µW) on its own. */
function expectSameShare(a: number, b: number, c: number, d: number, what: string): void {
  expect(b, what).toBeGreaterThan(0);
  expect(d, what).toBeGreaterThan(0);
  // a = b x c / d up to the floors: 1 unit on a, and b's and d's floors carried through the ratio.
  expect(Math.abs(a - (b * c) / d), what).toBeLessThanOrEqual(2 + (2 * b * c) / (d * d));
}

/**
 * A harness whose fake host counts `domainMsrs` besides the package, a child (`spin` or `sleep`)
 * registered as a VM of one vCPU, and the statistics files of that VM and of the host.
 */
async function registeredVm(kind: 'spin' | 'sleep', domainMsrs: readonly number[]) {
  const h = await startHarness({ intervalMs: 50, domainMsrs });
  cleanups.push(() => h.close());
  const child = startChild(kind);
  cleanups.push(() => child.kill());
  await until(() => fs.existsSync(`/proc/${child.pid}/task`));
  const c = await V2Client.connect(h.socketPath);
  cleanups.push(() => c.close());
  const { vmId } = await c.register({ pid: child.pid, vcpus: [{ tid: threadsOf(child.pid)[0]!, vpkg: 0 }] });
  const vm = StatsReader.open((await c.statsFd(vmId)).fd);
  cleanups.push(() => vm.close());
  const host = StatsReader.open((await c.statsFd(0)).fd);
  cleanups.push(() => host.close());
  return { h, c, child, vmId, vm, host };
}

describe('the statistics files on a host that reads other RAPL domains', () => {
  it("carry each domain the host reads, per virtual package for a VM and per package for the host, with the VM's share of each domain its share of the package", async () => {
    const { h, c, child, vm, host } = await registeredVm('spin', [
      MSR_PP0_ENERGY_STATUS,
      MSR_DRAM_ENERGY_STATUS,
      MSR_PLATFORM_ENERGY_STATUS,
    ]);

    // The descriptors: each domain read, none for uncore (not counting on this host).
    const names = (r: StatsReader) => r.layout.descriptors.map((d) => d.name);
    expect(names(vm)).toEqual(
      expect.arrayContaining(['core_energy', 'core_power', 'dram_energy', 'dram_power', 'psys_energy', 'psys_power']),
    );
    expect(names(vm).filter((n) => n.startsWith('uncore'))).toEqual([]);
    expect(names(host)).toEqual(
      expect.arrayContaining(['core_package_id', 'core_energy', 'core_unattributed_energy', 'dram_energy', 'psys_unattributed_energy']),
    );
    expect(names(host).filter((n) => n.startsWith('uncore'))).toEqual([]);
    for (const d of ['core', 'dram', 'psys']) {
      expect(vm.descriptor(`${d}_energy`)).toMatchObject({ size: 1, exponent: -6 });
      expect(host.descriptor(`${d}_energy`)).toMatchObject({ size: 1, exponent: -6 });
      expect(host.values(host.read(), `${d}_package_id`)).toEqual([0n]);
    }

    keepAddingEnergy(h);
    await until(() => num(vm, vm.read(), 'energy')[0]! > 2e6 && num(vm, vm.read(), 'power')[0]! > 0, LOADED_HOST_MS, 'the VM given energy');

    // One sample of both files (the same sample_monotonic): the VM's share of each domain is its share
    // of the package, and per domain the VM's energy plus the unattributed energy is the host's.
    let checked = false;
    for (let i = 0; i < 50 && !checked; i++) {
      const sv = vm.read();
      const sh = host.read();
      if (vm.value(sv, 'sample_monotonic') !== host.value(sh, 'sample_monotonic')) {
        await new Promise((r) => setTimeout(r, 5));
        continue;
      }
      const vmPkg = num(vm, sv, 'energy')[0]!;
      const hostPkg = num(host, sh, 'package_energy')[0]!;
      const hostPkgUn = num(host, sh, 'package_unattributed_energy')[0]!;
      expect(Math.abs(vmPkg + hostPkgUn - hostPkg)).toBeLessThanOrEqual(2);
      for (const d of ['core', 'dram', 'psys']) {
        const vmD = num(vm, sv, `${d}_energy`)[0]!;
        const hostD = num(host, sh, `${d}_energy`)[0]!;
        const hostDUn = num(host, sh, `${d}_unattributed_energy`)[0]!;
        expect(vmD, d).toBeGreaterThan(0);
        expectSameShare(vmD, vmPkg, hostD, hostPkg, `${d}: the VM's share`);
        expectSameShare(hostDUn, hostPkgUn, hostD, hostPkg, `${d}: the unattributed share`);
        expect(Math.abs(vmD + hostDUn - hostD), `${d}: VM + unattributed = host`).toBeLessThanOrEqual(2);
        // The power of the last interval, split the same way: the domain's in proportion to the package's.
        const vmPower = num(vm, sv, 'power')[0]!;
        const dPower = num(vm, sv, `${d}_power`)[0]!;
        expectSameShare(dPower, vmPower, hostD, hostPkg, `${d}: the VM's power`);
      }
      checked = true;
    }
    expect(checked, 'both files read at one sample').toBe(true);

    // The VM ends: its domain values stay, their power goes to 0.
    await c.close();
    await child.kill();
    await until(() => vm.value(vm.read(), 'ended') === 1n, LOADED_HOST_MS, 'the file says the VM ended');
    const final = vm.read();
    for (const d of ['core', 'dram', 'psys']) {
      expect(num(vm, final, `${d}_power`)).toEqual([0]);
      expect(num(vm, final, `${d}_energy`)[0]).toBeGreaterThan(0);
    }
  });

  it('have no domain descriptors on a host that reads the package alone', async () => {
    const { vm, host } = await registeredVm('sleep', []);
    const domainNames = /^(core|uncore|dram|psys)_/;
    expect(vm.layout.descriptors.filter((d) => domainNames.test(d.name))).toEqual([]);
    expect(host.layout.descriptors.filter((d) => domainNames.test(d.name))).toEqual([]);
    expect(vm.descriptor('energy')).toBeDefined();
    expect(host.descriptor('package_energy')).toBeDefined();
  });
});
