/**
 * THE words of "cannot find an energy source" (--energy-source auto found nothing): what this host has
 * and lacks, in the order a user checks it (RAPL at all, the msr driver, the right to open its
 * devices, the powercap zones), the fix that fits first, and always the way to try vmsr-helper
 * without RAPL: the synthetic source and the demo (docs/try-it.md).
 */
import fs from 'node:fs';
import path from 'node:path';
import { cannot } from '../common/errors.js';
import { TRY_WITHOUT_RAPL } from '../msr/errno-hints.js';
import type { Vendor } from '../model/host.js';
import { POWERCAP_FIX } from './powercap-source.js';

interface NoSourceFacts {
  /** The first online CPU's MSR device, and why it did not open (an errno code, or a message). */
  msrFile: string;
  msrWhy: string;
  /** Whether the msr driver is loaded (SYSROOT/module/msr). */
  msrDriverLoaded: boolean;
  /** Why the powercap zones give no package energy. */
  powercapWhy: string;
  /** Why this host surely has no RAPL registers (a VM, an AMD CPU without the flag), or null when it may. */
  noRapl: string | null;
}

/** Why /proc/cpuinfo says this CPU has no RAPL registers, or null when it may have them. */
export function noRaplReason(procRoot: string, vendor: Vendor): string | null {
  let flags: string[];
  try {
    const line = /^flags\s*:(.*)$/m.exec(fs.readFileSync(path.join(procRoot, 'cpuinfo'), 'utf8'));
    if (!line) return null;
    flags = line[1]!.trim().split(/\s+/);
  } catch {
    return null;
  }
  if (flags.includes('hypervisor'))
    return `this host is a virtual machine (flag 'hypervisor' in ${procRoot}/cpuinfo), and hypervisors give their guests no RAPL registers unless asked (QEMU's rapl=true)`;
  if (vendor === 'amd' && !flags.includes('rapl')) return `this AMD CPU has no RAPL (no flag 'rapl' in ${procRoot}/cpuinfo)`;
  return null;
}

/** The error message, from the facts: what the host has and lacks, then the fixes, the fitting one first. */
export function noEnergySourceMessage(f: NoSourceFacts): string {
  const denied = /^(EACCES|EPERM)$/.test(f.msrWhy);
  const msrFact = denied
    ? `the msr driver is loaded but this user may not open ${f.msrFile} (${f.msrWhy})`
    : f.msrDriverLoaded
      ? `the msr driver is loaded but ${f.msrFile} does not open (${f.msrWhy})`
      : `the msr driver is not loaded (${f.msrFile}: ${f.msrWhy})`;
  const facts = [...(f.noRapl ? [f.noRapl] : []), msrFact, `no powercap RAPL zone opens (${f.powercapWhy})`];
  const withRapl = denied
    ? 'run as root (or with CAP_SYS_RAWIO)'
    : `load the msr driver with 'modprobe msr', or ${POWERCAP_FIX}, and run as root`;
  const fixes = f.noRapl ? `${TRY_WITHOUT_RAPL}; on a host with RAPL, ${withRapl}` : `${withRapl}; or, ${TRY_WITHOUT_RAPL}`;
  return cannot('find an energy source', facts.join('; '), fixes);
}
