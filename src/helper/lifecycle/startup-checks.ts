/** What must hold before the helper serves, each failure naming its fix: an Intel or AMD CPU, MSR devices, the right to read them. */
import path from 'node:path';
import { capget } from '../../os/libc/capability-calls.js';
import { DEFAULT_HOST_PATHS } from '../../msr/host-paths.js';
import { readHostCpus } from '../../msr/topology.js';
import type { MsrDevice } from '../../msr/device.js';
import type { HostCpu, Vendor } from '../../model/host.js';
import { RAWIO_MASK } from '../../os/privileges/capabilities.js';
import { msrErrnoHint } from '../../msr/errno-hints.js';
import { cannotError } from '../../common/errors.js';

export type VendorChoice = 'auto' | Vendor;

export function checkTopology(sysRoot: string): HostCpu[] {
  let cpus: HostCpu[];
  try {
    cpus = readHostCpus(sysRoot);
  } catch (e) {
    throw cannotError(`read the CPU topology under ${sysRoot}`, (e as Error).message, 'is sysfs mounted, or is --sys-root right?');
  }
  if (cpus.length === 0) throw new Error(`no online CPU listed in ${path.join(sysRoot, 'devices/system/cpu/online')}`);
  return cpus;
}

/** The msr driver wants CAP_SYS_RAWIO at open (else EPERM); checked for the real devices only (tests point --msr-path at files). */
export function checkPermission(template: string): void {
  if (template !== DEFAULT_HOST_PATHS.msrPathTemplate) return;
  if (process.getuid?.() === 0) return;
  if ((capget().effective & RAWIO_MASK) !== 0n) return;
  throw cannotError(
    'read MSRs',
    'it needs root or CAP_SYS_RAWIO',
    'run as root (the helper drops to CAP_SYS_RAWIO itself, and to -u/-g if given)',
  );
}

/** Opens every online CPU's MSR device now, before privileges are dropped; they are reused after. */
export function openMsrDevices(device: MsrDevice, cpus: readonly HostCpu[]): void {
  for (const { cpu } of cpus) {
    try {
      device.open(cpu);
    } catch (e) {
      const err = e as NodeJS.ErrnoException;
      const hint = msrErrnoHint(err.code);
      throw cannotError(`open ${device.path(cpu)}`, hint?.why ?? err.message, hint?.fix);
    }
  }
}
