/**
 * What the engine and traces need to know about the host: vendor, CLK_TCK, CPUs and packages, and each
 * package's RAPL unit (plus Intel's power limit/info when readable).
 */
import type { HostInfo, HostPackage } from '../ratio/types.js';
import { clockTicksPerSecond } from '../os/libc.js';
import type { MsrDevice } from './device.js';
import type { HostPaths } from './host-paths.js';
import { MSR_AMD_RAPL_POWER_UNIT, MSR_PKG_POWER_INFO, MSR_PKG_POWER_LIMIT, MSR_RAPL_POWER_UNIT } from './registers.js';
import { type Vendor } from '../ratio/types.js';
import { SYNTHETIC_DEFAULTS } from './energy-source.js';
import { firstCpuPerPackage, readHostCpus } from './topology.js';
import { readVendor } from './vendor.js';

export interface ReadHostInfoOptions {
  paths: HostPaths;
  device: MsrDevice;
  vendor?: Vendor;
  energySource?: 'msr' | 'synthetic';
  /** The MSR_RAPL_POWER_UNIT a synthetic source uses; default 0xa0e03. */
  syntheticPowerUnit?: bigint;
}

export function readHostInfo(o: ReadHostInfoOptions): HostInfo {
  const vendor = o.vendor ?? readVendor(o.paths.procRoot);
  const clkTck = clockTicksPerSecond();
  const cpus = readHostCpus(o.paths.sysRoot);
  if (cpus.length === 0) throw new Error(`${o.paths.sysRoot}/devices/system/cpu/online lists no CPU`);
  const packages: HostPackage[] = [];
  for (const [pkg, cpu] of [...firstCpuPerPackage(cpus)].sort((a, b) => a[0] - b[0])) {
    if (o.energySource === 'synthetic') {
      packages.push({ package: pkg, powerUnit: o.syntheticPowerUnit ?? SYNTHETIC_DEFAULTS.powerUnit });
      continue;
    }
    // An MsrReadError here goes to the caller as it is: msrErrorWithHint adds the fix it can offer.
    const powerUnit = o.device.read(cpu, vendor === 'amd' ? MSR_AMD_RAPL_POWER_UNIT : MSR_RAPL_POWER_UNIT);
    const p: HostPackage = { package: pkg, powerUnit };
    if (vendor === 'intel') {
      // Optional registers: some CPUs or hypervisors do not expose them.
      try {
        p.powerLimit = o.device.read(cpu, MSR_PKG_POWER_LIMIT);
      } catch {
        /* absent */
      }
      try {
        p.powerInfo = o.device.read(cpu, MSR_PKG_POWER_INFO);
      } catch {
        /* absent */
      }
    }
    packages.push(p);
  }
  return { vendor, clkTck, cpus, packages };
}
