/** CPU vendor (which registers hold package energy), family and model (some domains' units) from /proc/cpuinfo. */
import fs from 'node:fs';
import path from 'node:path';
import type { Vendor } from '../model/host.js';
import { cannotError } from '../common/errors.js';

export interface CpuModel {
  family: number;
  model: number;
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
  const id = /^vendor_id\s*:\s*(\S+)/m.exec(text)?.[1] ?? '(no vendor_id line)';
  if (id === 'GenuineIntel') return 'intel';
  if (id === 'AuthenticAMD' || id === 'HygonGenuine') return 'amd';
  throw cannotError(
    `serve CPU vendor ${id}`,
    'RAPL MSRs are known only for Intel (GenuineIntel) and AMD (AuthenticAMD, family 17h+)',
    'run on an Intel or AMD host',
  );
}

/** The first "cpu family" and "model" of /proc/cpuinfo under `procRoot`; undefined when it cannot be read or lacks them. */
export function readCpuModel(procRoot: string): CpuModel | undefined {
  let cpuinfo: string;
  try {
    cpuinfo = fs.readFileSync(path.join(procRoot, 'cpuinfo'), 'utf8');
  } catch {
    return undefined;
  }
  const family = /^cpu family\s*:\s*(\d+)\s*$/m.exec(cpuinfo);
  const model = /^model\s*:\s*(\d+)\s*$/m.exec(cpuinfo);
  return family && model ? { family: Number(family[1]), model: Number(model[1]) } : undefined;
}
