/** The powercap RAPL zones (docs/energy-domains.md): intel-rapl:N (package-N, psys) and :N:M (core, uncore, dram); AMD Zen too. */
import fs from 'node:fs';
import path from 'node:path';
import type { Vendor } from '../model/host.js';
import { isEnergyDomain, type EnergyDomain } from './energy-source.js';

export const POWERCAP_CLASS_DIR = 'class/powercap';

/** Zones of the MSR interface; intel-rapl-mmio repeats the package zone (for its power limits): read, it would count twice. */
export const ZONE_ID = /^intel-rapl:(\d+)(?::(\d+))?$/;

/** energy_uj counts 0..max_energy_range_uj, then starts again at 0. */
export const ENERGY_UJ = 'energy_uj';
export const MAX_ENERGY_RANGE_UJ = 'max_energy_range_uj';

export interface PowercapZone {
  /** intel-rapl:N or intel-rapl:N:M */
  id: string;
  name: string;
  domain: EnergyDomain;
  /** The host package (physical_package_id) the zone counts; undefined for a platform zone (psys). */
  pkg: number | undefined;
  /** The die of a multi-die package (package-N-die-M and its sub-zones): the dies' counters add up to the package's. */
  die?: number;
  energyPath: string;
  maxEnergyRangeUj: bigint;
}

interface PowercapScan {
  zones: PowercapZone[];
  /** Zones found and not read, and why. */
  skipped: { id: string; why: string }[];
}

/** A package zone's name: package-N, or package-N-die-M on a multi-die part (Linux names them so when a package has several dies). */
const PACKAGE_ZONE_NAME = /^package-(\d+)(?:-die-(\d+))?$/;

function packageOf(m: RegExpExecArray): { pkg: number; die?: number } {
  return m[2] === undefined ? { pkg: Number(m[1]) } : { pkg: Number(m[1]), die: Number(m[2]) };
}

function readAttr(dir: string, attr: string): string {
  return fs.readFileSync(path.join(dir, attr), 'utf8').trim();
}

/** The RAPL zones under `sysRoot` by id (AMD's core sub-zone skipped: it counts one core); throws the fs error of the listing. */
export function scanPowercap(sysRoot: string, vendor: Vendor): PowercapScan {
  const classDir = path.join(sysRoot, POWERCAP_CLASS_DIR);
  const ids = fs
    .readdirSync(classDir)
    .filter((e) => ZONE_ID.test(e))
    .sort((a, b) => a.localeCompare(b, 'en', { numeric: true }));
  const names = new Map<string, string>();
  const out: PowercapScan = { zones: [], skipped: [] };
  for (const id of ids) {
    const dir = path.join(classDir, id);
    let name: string;
    let max: bigint;
    try {
      name = readAttr(dir, 'name');
      const text = readAttr(dir, MAX_ENERGY_RANGE_UJ);
      if (!/^\d+$/.test(text) || BigInt(text) === 0n)
        throw new Error(`${MAX_ENERGY_RANGE_UJ} is ${JSON.stringify(text)}, not a positive count`);
      max = BigInt(text);
    } catch (e) {
      out.skipped.push({ id, why: e instanceof Error ? e.message : String(e) });
      continue;
    }
    names.set(id, name);
    const m = ZONE_ID.exec(id)!;
    const zone = { id, name, energyPath: path.join(dir, ENERGY_UJ), maxEnergyRangeUj: max };
    if (m[2] === undefined) {
      const pkg = PACKAGE_ZONE_NAME.exec(name);
      if (pkg) out.zones.push({ ...zone, domain: 'package', ...packageOf(pkg) });
      else if (name === 'psys') out.zones.push({ ...zone, domain: 'psys', pkg: undefined });
      else out.skipped.push({ id, why: `zone ${JSON.stringify(name)} is neither package-N, package-N-die-M nor psys` });
      continue;
    }
    const parent = PACKAGE_ZONE_NAME.exec(names.get(`intel-rapl:${m[1]}`) ?? '');
    if (!parent) out.skipped.push({ id, why: `its parent intel-rapl:${m[1]} is not a package zone` });
    else if (!isEnergyDomain(name) || name === 'package' || name === 'psys')
      out.skipped.push({ id, why: `sub-zone ${JSON.stringify(name)} is not core, uncore or dram` });
    else if (name === 'core' && vendor === 'amd') out.skipped.push({ id, why: 'on AMD the core zone counts one core only' });
    else out.zones.push({ ...zone, domain: name, ...packageOf(parent) });
  }
  return out;
}
