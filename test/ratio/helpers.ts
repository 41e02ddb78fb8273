/** Builders for engine tests: stat lines as the kernel prints them, hosts and samples. */
import type { HostInfo } from '../../src/model/host.js';
import type { Sample } from '../../src/model/sample.js';

export interface StatFields {
  tid: number;
  comm?: string;
  utime: number;
  stime?: number;
  starttime: number;
  processor: number;
}

/** A 52-field /proc/<pid>/task/<tid>/stat line (no newline). */
export function statLine(f: StatFields): string {
  // fields[0] is field 3 (state); field N sits at index N - 3.
  const fields: string[] = new Array<string>(50).fill('0');
  fields[0] = 'S';
  fields[4 - 3] = '1';
  fields[18 - 3] = '20';
  fields[20 - 3] = '8';
  fields[14 - 3] = String(f.utime);
  fields[15 - 3] = String(f.stime ?? 0);
  fields[22 - 3] = String(f.starttime);
  fields[23 - 3] = '601366528';
  fields[25 - 3] = '18446744073709551615';
  fields[39 - 3] = String(f.processor);
  return `${f.tid} (${f.comm ?? `t${f.tid}`}) ${fields.join(' ')}`;
}

/** ESU 14: one counter unit is 2^-14 J (MSR_RAPL_POWER_UNIT 0xa0e03, as on most Intel parts). */
export const PU_ESU14 = 0xa0e03n;
export const UNIT14 = 2 ** -14;

/** One package per entry of `cpusPerPackage`, CPUs numbered in order; CLK_TCK 100. */
export function host(cpusPerPackage: number[] = [2], powerUnit: bigint = PU_ESU14): HostInfo {
  const cpus: HostInfo['cpus'] = [];
  let cpu = 0;
  cpusPerPackage.forEach((n, p) => {
    for (let i = 0; i < n; i++) cpus.push({ cpu: cpu++, pkg: p });
  });
  return { vendor: 'intel', clkTck: 100, cpus, packages: cpusPerPackage.map((_, p) => ({ pkg: p, powerUnit })) };
}

/** Joules -> counter units at ESU 14. */
export function units(joules: number): bigint {
  return BigInt(Math.round(joules / UNIT14));
}

export interface ThreadAt {
  tid: number;
  ticks: number;
  starttime?: number;
  cpu?: number;
}

/** A sample at `seconds`, package energy raw values, and pid -> threads. */
export function sample(seconds: number, energy: Record<number, bigint>, tasks: Record<number, ThreadAt[]> = {}): Sample {
  const t = new Map<number, Map<number, string>>();
  for (const [pid, threads] of Object.entries(tasks)) {
    t.set(
      Number(pid),
      new Map(
        threads.map((th) => [th.tid, statLine({ tid: th.tid, utime: th.ticks, starttime: th.starttime ?? 1000, processor: th.cpu ?? 0 })]),
      ),
    );
  }
  return {
    tNs: BigInt(Math.round(seconds * 1e9)),
    energy: new Map(Object.entries(energy).map(([k, v]) => [Number(k), v])),
    tasks: t,
  };
}
