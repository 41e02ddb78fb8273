/** CPU vendor from /proc/cpuinfo: decides which registers hold package energy. */
import fs from 'node:fs';
import path from 'node:path';
import type { Vendor } from './registers.js';

export function parseVendor(cpuinfo: string): Vendor | { unsupported: string } {
  const m = /^vendor_id\s*:\s*(\S+)/m.exec(cpuinfo);
  const id = m?.[1] ?? '(no vendor_id line)';
  if (id === 'GenuineIntel') return 'intel';
  if (id === 'AuthenticAMD' || id === 'HygonGenuine') return 'amd';
  return { unsupported: id };
}

export function readVendor(procRoot: string): Vendor {
  const file = path.join(procRoot, 'cpuinfo');
  const v = parseVendor(fs.readFileSync(file, 'utf8'));
  if (typeof v !== 'string') {
    throw new Error(`${file}: CPU vendor ${v.unsupported} has no RAPL MSRs this helper knows; Intel (GenuineIntel) or AMD (AuthenticAMD) is required`);
  }
  return v;
}
