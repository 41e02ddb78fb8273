/**
 * THE rule of --energy-source auto: the RAPL MSRs when an MSR device opens (they also answer QEMU's
 * legacy requests), else the kernel's powercap zones when a package zone's energy_uj opens, else a
 * failure naming both fixes. Run where the opens will be made for real (the daemon: as root, before
 * its privilege drop).
 */
import fs from 'node:fs';
import { cannot } from '../common/errors.js';
import { msrPath } from '../msr/host-paths.js';
import type { HostCpu, Vendor } from '../ratio/types.js';
import type { EnergySourceChoice, EnergySourceKind } from './kinds.js';
import { POWERCAP_FIX } from './powercap-source.js';
import { scanPowercap } from './powercap-zones.js';

export interface ChooseOptions {
  msrPathTemplate: string;
  sysRoot: string;
  cpus: readonly HostCpu[];
  vendor: Vendor;
  /** A further fix the caller offers (record: the synthetic source). */
  alternative?: string;
}

interface Chosen {
  kind: EnergySourceKind;
  /** Why: "asked for", or what auto found. */
  why: string;
}

/** Why `file` does not open read-only, or undefined when it does (closed at once). */
function openFails(file: string): string | undefined {
  try {
    fs.closeSync(fs.openSync(file, fs.constants.O_RDONLY));
    return undefined;
  } catch (e) {
    return `${file}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`;
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
  for (const pkg of new Set(o.cpus.map((c) => c.package))) {
    const zone = zones.find((z) => z.domain === 'package' && z.package === pkg);
    if (zone === undefined) return `no package-${pkg} zone in ${o.sysRoot}/class/powercap`;
    const why = openFails(zone.energyPath);
    if (why !== undefined) return why;
  }
  return undefined;
}

/** The kind to build: `choice` itself unless auto. Throws, naming both fixes, when auto finds neither. */
export function chooseEnergySource(choice: EnergySourceChoice, o: ChooseOptions): Chosen {
  if (choice !== 'auto') return { kind: choice, why: 'asked for' };
  const first = Math.min(...o.cpus.map((c) => c.cpu));
  const msr = openFails(msrPath(o.msrPathTemplate, first));
  if (msr === undefined) return { kind: 'msr', why: 'auto: the MSR devices open' };
  const powercap = powercapFails(o);
  if (powercap === undefined) return { kind: 'powercap', why: `auto: no MSR device (${msr}), the powercap zones open` };
  throw new Error(
    cannot(
      'find an energy source',
      `no MSR device opens (${msr}) and no powercap RAPL zone does (${powercap})`,
      `load the msr driver with 'modprobe msr', or ${POWERCAP_FIX}, and run as root${o.alternative ? `; or ${o.alternative}` : ''}`,
    ),
  );
}
