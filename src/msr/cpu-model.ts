/** CPU family and model from /proc/cpuinfo: some RAPL domains count in a unit of their own on some models. */
import fs from 'node:fs';
import path from 'node:path';

export interface CpuModel {
  family: number;
  model: number;
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
