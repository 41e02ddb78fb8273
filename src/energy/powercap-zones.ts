/**
 * The kernel's powercap RAPL zones (Documentation/power/powercap/powercap.rst; docs/energy-domains.md):
 * intel-rapl:N (package-N or psys) and its sub-zones intel-rapl:N:M (core, uncore, dram), energy_uj
 * counting µJ and wrapping after max_energy_range_uj. AMD Zen has them too (intel_rapl_msr).
 */
import fs from 'node:fs';
import path from 'node:path';
import type { Vendor } from '../model/host.js';
import { isEnergyDomain, type EnergyDomain } from './energy-source.js';

export const POWERCAP_CLASS_DIR = 'class/powercap';

/**
 * Zones of the MSR interface: intel-rapl:N and intel-rapl:N:M. intel-rapl-mmio (the MMIO interface of
 * client parts) repeats the package zone for its power limits and is not read: it would count twice.
 */
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
  /**
   * The die of a multi-die package (zone name package-N-die-M, and its sub-zones): a package has one
   * zone per die and per domain, whose counters add up to the package's.
   */
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

/**
 * The RAPL zones under `sysRoot`, sorted by id. On AMD a core sub-zone is skipped: the kernel reads it
 * from the core energy register of one CPU, so it counts one core, not the package's cores.
 * Throws the fs error when the class directory cannot be listed.
 */
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
