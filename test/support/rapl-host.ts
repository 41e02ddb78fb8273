/**
 * A fake RAPL package (FakeHost) that a real QEMU with rapl=true accepts (test/support/rapl-qemu.ts):
 * the same packages as the real host's CPUs (QEMU asks for the CPU its threads ran on), and start-up
 * registers that are not zero (QEMU refuses RAPL otherwise).
 */
import fs from 'node:fs';
import {
  MSR_AMD_PKG_ENERGY_STATUS,
  MSR_AMD_RAPL_POWER_UNIT,
  MSR_PKG_ENERGY_STATUS,
  MSR_PKG_POWER_INFO,
  MSR_PKG_POWER_LIMIT,
  MSR_RAPL_POWER_UNIT,
} from '../../src/msr/registers.js';
import { FakeHost } from './fake-host.js';

/** The real host's package of each CPU. */
export function realPackages(): number[] {
  const out: number[] = [];
  for (let cpu = 0; ; cpu++) {
    const f = `/sys/devices/system/cpu/cpu${cpu}/topology/physical_package_id`;
    if (!fs.existsSync(f)) return out;
    out.push(Number(fs.readFileSync(f, 'utf8').trim()));
  }
}

/**
 * An Intel or AMD package with its energy counter at `counterStart`; the caller cleans the host up.
 * `energyMsr` is the counter's register (what an EnergyPump drives).
 */
export function raplFakeHost(vendor: 'intel' | 'amd', counterStart: number): { host: FakeHost; energyMsr: number } {
  const host = new FakeHost({ packages: realPackages() });
  if (vendor === 'intel') {
    host.writePackageMsr(0, MSR_PKG_POWER_LIMIT, 0x0000_8168_0001_83e8n);
    host.writePackageMsr(0, MSR_PKG_POWER_INFO, 0x0000_0000_0000_0460n);
    host.writePackageCounter32(0, MSR_PKG_ENERGY_STATUS, counterStart);
    host.writePackageMsr(0, MSR_RAPL_POWER_UNIT, 0xa0e03n);
    return { host, energyMsr: MSR_PKG_ENERGY_STATUS };
  }
  // AMD: the counter's file bytes overlap the unit register's upper bytes; the unit is written last
  // so QEMU's start-up read sees AMD's usual 0x000a1003 (ESU 16, PU 3).
  host.writePackageCounter32(0, MSR_AMD_PKG_ENERGY_STATUS, counterStart);
  host.writePackageMsr(0, MSR_AMD_RAPL_POWER_UNIT, 0xa1003n);
  return { host, energyMsr: MSR_AMD_PKG_ENERGY_STATUS };
}
