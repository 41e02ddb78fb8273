/**
 * THE rule of --energy-source auto: the RAPL MSRs when an MSR device opens (they also answer QEMU's
 * legacy requests), else the powercap zones when every package zone's energy_uj opens, else a failure
 * saying what the host lacks (no-energy-source.ts). Run where the opens are made for real (the daemon:
 * as root, before its privilege drop).
 */
import fs from 'node:fs';
import { msrPath } from '../msr/host-paths.js';
import type { HostCpu, Vendor } from '../model/host.js';
import type { EnergySourceChoice, EnergySourceKind } from './kinds.js';
import { noEnergySourceMessage, noRaplReason } from './no-energy-source.js';
import { scanPowercap } from './powercap-zones.js';

export interface ChooseOptions {
  msrPathTemplate: string;
  sysRoot: string;
  cpus: readonly HostCpu[];
  vendor: Vendor;
  /** Where /proc/cpuinfo is read to tell a host without RAPL (default /proc). */
  procRoot?: string;
}

interface Chosen {
  kind: EnergySourceKind;
  /** "asked for", or what auto found. */
  why: string;
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
export function chooseEnergySource(choice: EnergySourceChoice, o: ChooseOptions): Chosen {
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
