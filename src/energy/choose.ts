/**
 * THE rule of --energy-source auto, where the opens are real (the daemon before its drop): the MSRs when a device opens (they
 * also answer QEMU), else powercap when every package zone opens, else what the host lacks, the fitting fix first.
 */
import fs from 'node:fs';
import path from 'node:path';
import { cannot } from '../common/errors.js';
import { TRY_WITHOUT_RAPL } from '../msr/errno-hints.js';
import { msrPath } from '../msr/host-paths.js';
import type { HostCpu, Vendor } from '../model/host.js';
import type { EnergySourceChoice, EnergySourceKind } from './kinds.js';
import { POWERCAP_FIX } from './powercap-source.js';
import { scanPowercap } from './powercap-zones.js';

export interface ChooseOptions {
  msrPathTemplate: string;
  sysRoot: string;
  cpus: readonly HostCpu[];
  vendor: Vendor;
  /** Where /proc/cpuinfo is read to tell a host without RAPL (default /proc). */
  procRoot?: string;
}

/** Why `file` does not open read-only (its errno code), or undefined when it does (closed at once). */
function openError(file: string): string | undefined {
  try {
    fs.closeSync(fs.openSync(file, fs.constants.O_RDONLY));
    return undefined;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code ?? (e as Error).message;
  }
}

/** Why the powercap zones cannot give package energy, or undefined when every package's zone opens. */
function powercapFails(o: ChooseOptions): string | undefined {
  let zones;
  try {
    zones = scanPowercap(o.sysRoot, o.vendor).zones;
  } catch (e) {
    return `${o.sysRoot}/class/powercap: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`;
  }
  for (const pkg of new Set(o.cpus.map((c) => c.pkg))) {
    const zone = zones.find((z) => z.domain === 'package' && z.pkg === pkg);
    if (zone === undefined) return `no package-${pkg} zone in ${o.sysRoot}/class/powercap`;
    const why = openError(zone.energyPath);
    if (why !== undefined) return `${zone.energyPath}: ${why}`;
  }
  return undefined;
}

/** The kind to build: `choice` itself unless auto. Throws, saying what the host lacks and the fixes, when auto finds neither. */
export function chooseEnergySource(choice: EnergySourceChoice, o: ChooseOptions): { kind: EnergySourceKind; why: string } {
  if (choice !== 'auto') return { kind: choice, why: 'asked for' };
  const first = Math.min(...o.cpus.map((c) => c.cpu));
  const msrFile = msrPath(o.msrPathTemplate, first);
  const msrWhy = openError(msrFile);
  if (msrWhy === undefined) return { kind: 'msr', why: 'auto: the MSR devices open' };
  const powercap = powercapFails(o);
  if (powercap === undefined) return { kind: 'powercap', why: `auto: no MSR device (${msrFile}: ${msrWhy}), the powercap zones open` };
  throw new Error(
    noEnergySourceMessage({
      msrFile,
      msrWhy,
      msrDriverLoaded: fs.existsSync(`${o.sysRoot}/module/msr`),
      powercapWhy: powercap,
      noRapl: noRaplReason(o.procRoot ?? '/proc', o.vendor),
    }),
  );
}

interface NoSourceFacts {
  /** The first online CPU's MSR device, and why it did not open (an errno code or a message). */
  msrFile: string;
  msrWhy: string;
  msrDriverLoaded: boolean;
  powercapWhy: string;
  /** Why this host surely has no RAPL registers (a VM, an AMD CPU without the flag), or null when it may. */
  noRapl: string | null;
}

/** Why /proc/cpuinfo says this CPU has no RAPL registers, or null when it may have them. */
function noRaplReason(procRoot: string, vendor: Vendor): string | null {
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
