/** Host CPU topology from sysfs: which CPUs are online and which package each belongs to. */
import fs from 'node:fs';
import path from 'node:path';
import type { HostCpu } from '../model/host.js';

/** Parses a sysfs CPU list such as "0-3,8,10-11". Throws on anything else. */
function parseCpuList(text: string): number[] {
  const out: number[] = [];
  const trimmed = text.trim();
  if (trimmed === '') return out;
  for (const part of trimmed.split(',')) {
    const m = /^(\d+)(?:-(\d+))?$/.exec(part);
    if (!m) throw new Error(`bad CPU list ${JSON.stringify(text)}`);
    const lo = Number(m[1]);
    const hi = m[2] === undefined ? lo : Number(m[2]);
    if (hi < lo || hi - lo > 65536) throw new Error(`bad CPU range ${JSON.stringify(part)}`);
    for (let c = lo; c <= hi; c++) out.push(c);
  }
  return out;
}

export function readOnlineCpus(sysRoot: string): number[] {
  const file = path.join(sysRoot, 'devices/system/cpu/online');
  return parseCpuList(fs.readFileSync(file, 'utf8'));
}

/** Online CPUs with their physical_package_id, sorted by CPU number. */
export function readHostCpus(sysRoot: string): HostCpu[] {
  return readOnlineCpus(sysRoot).map((cpu) => {
    const file = path.join(sysRoot, `devices/system/cpu/cpu${cpu}/topology/physical_package_id`);
    const text = fs.readFileSync(file, 'utf8').trim();
    const pkg = Number(text);
    if (!/^-?\d+$/.test(text) || pkg < 0) throw new Error(`${file}: bad package id ${JSON.stringify(text)}`);
    return { cpu, pkg };
  });
}

/** The lowest-numbered online CPU of each package: the one its package MSRs are read through. */
export function firstCpuPerPackage(cpus: readonly HostCpu[]): Map<number, number> {
  const m = new Map<number, number>();
  for (const c of [...cpus].sort((a, b) => a.cpu - b.cpu)) if (!m.has(c.pkg)) m.set(c.pkg, c.cpu);
  return m;
}

/** Per package, the first online CPU of each core (SMT siblings share a core_id): where per-core registers are read; throws fs errors. */
export function firstCpuPerCore(sysRoot: string, cpus: readonly HostCpu[]): Map<number, number[]> {
  const seen = new Set<string>();
  const out = new Map<number, number[]>();
  for (const c of [...cpus].sort((a, b) => a.cpu - b.cpu)) {
    const text = fs.readFileSync(path.join(sysRoot, `devices/system/cpu/cpu${c.cpu}/topology/core_id`), 'utf8').trim();
    if (!/^\d+$/.test(text)) throw new Error(`cpu${c.cpu}/topology/core_id: bad core id ${JSON.stringify(text)}`);
    const key = `${c.pkg}:${text}`;
    if (seen.has(key)) continue;
    seen.add(key);
    out.set(c.pkg, [...(out.get(c.pkg) ?? []), c.cpu]);
  }
  return out;
}
