/** CPU vendor from /proc/cpuinfo: decides which registers hold package energy. */
import fs from 'node:fs';
import path from 'node:path';
import type { Vendor } from '../model/host.js';
import { cannotError } from '../common/errors.js';

function parseVendor(cpuinfo: string): Vendor | { unsupported: string } {
  const m = /^vendor_id\s*:\s*(\S+)/m.exec(cpuinfo);
  const id = m?.[1] ?? '(no vendor_id line)';
  if (id === 'GenuineIntel') return 'intel';
  if (id === 'AuthenticAMD' || id === 'HygonGenuine') return 'amd';
  return { unsupported: id };
}

/** The vendor of /proc/cpuinfo under `procRoot`; every failure names its fix. */
export function readVendor(procRoot: string): Vendor {
  const file = path.join(procRoot, 'cpuinfo');
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    throw cannotError(`read ${file} to tell the CPU vendor`, (e as Error).message, 'pass --vendor intel|amd or a correct --proc-root');
  }
  const v = parseVendor(text);
  if (typeof v !== 'string') {
    throw cannotError(
      `serve CPU vendor ${v.unsupported}`,
      'RAPL MSRs are known only for Intel (GenuineIntel) and AMD (AuthenticAMD, family 17h+)',
      'run on an Intel or AMD host',
    );
  }
  return v;
}
