/** CPU family and model from /proc/cpuinfo: some RAPL domains count in a unit of their own on some models. */
import fs from 'node:fs';
import path from 'node:path';

export interface CpuModel {
  family: number;
  model: number;
}

/** The first "cpu family" and "model" lines of a /proc/cpuinfo text; undefined when either is missing. */
function parseCpuModel(cpuinfo: string): CpuModel | undefined {
  const family = /^cpu family\s*:\s*(\d+)\s*$/m.exec(cpuinfo);
  const model = /^model\s*:\s*(\d+)\s*$/m.exec(cpuinfo);
  if (!family || !model) return undefined;
  return { family: Number(family[1]), model: Number(model[1]) };
}

/** The model of /proc/cpuinfo under `procRoot`; undefined when it cannot be read or lacks the lines. */
export function readCpuModel(procRoot: string): CpuModel | undefined {
  try {
    return parseCpuModel(fs.readFileSync(path.join(procRoot, 'cpuinfo'), 'utf8'));
  } catch {
    return undefined;
  }
}
