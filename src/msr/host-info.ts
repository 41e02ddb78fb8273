/** What the engine and traces know of the host: vendor, CLK_TCK, CPUs, packages, their RAPL units (and Intel's limit and info). */
import type { HostInfo, HostPackage, Vendor } from '../model/host.js';
import { clockTicksPerSecond } from '../os/libc/processes.js';
import type { MsrDevice } from './device.js';
import type { HostPaths } from './host-paths.js';
import { MSR_PKG_POWER_INFO, MSR_PKG_POWER_LIMIT, powerUnitMsr } from './registers.js';
import { firstCpuPerPackage, readHostCpus } from './topology.js';
import { readVendor } from './vendor.js';

export interface ReadHostInfoOptions {
  paths: HostPaths;
  device: MsrDevice;
  vendor?: Vendor;
  /** Every package's power unit when energy does not come from the MSRs (energy/create.ts): then no MSR is read. */
  powerUnit?: bigint;
}

export function readHostInfo(o: ReadHostInfoOptions): HostInfo {
  const vendor = o.vendor ?? readVendor(o.paths.procRoot);
  const clkTck = clockTicksPerSecond();
  const cpus = readHostCpus(o.paths.sysRoot);
  if (cpus.length === 0) throw new Error(`${o.paths.sysRoot}/devices/system/cpu/online lists no CPU`);
  const packages: HostPackage[] = [];
  for (const [pkg, cpu] of [...firstCpuPerPackage(cpus)].sort((a, b) => a[0] - b[0])) {
    if (o.powerUnit !== undefined) {
      packages.push({ pkg, powerUnit: o.powerUnit });
      continue;
    }
    // An MsrReadError here goes to the caller as it is: msrErrorWithHint adds the fix it can offer.
    const powerUnit = o.device.read(cpu, powerUnitMsr(vendor));
    const p: HostPackage = { pkg, powerUnit };
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
