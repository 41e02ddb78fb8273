/**
 * Replay speed: a generated trace (default 100 VMs x 10 threads x 600 samples, made in memory, never
 * written to disk) through the reader + engine, and through the engine alone. Prints intervals per
 * second; never fails on timing.
 */
import { RatioEngine } from '../src/ratio/attribution.js';
import { replayRecords } from '../src/ratio/trace-replay.js';
import { readTraceStream } from '../src/trace/reader.js';
import { type TraceRecord } from '../src/ratio/trace-records.js';

export interface GeneratedTraceShape {
  vms: number;
  threadsPerVm: number;
  samples: number;
  /** Host CPUs, split evenly over packages. */
  cpus?: number;
  packages?: number;
}

function stat(tid: number, comm: string, ticks: number, starttime: number, cpu: number): string {
  return (
    `${tid} (${comm}) S 1 ${tid} ${tid} 0 -1 138412224 326 0 0 0 ${ticks} 0 0 0 20 0 8 0 ${starttime} ` +
    `601366528 10693 18446744073709551615 94110025916416 94110032702677 140724509459584 0 0 0 2147219511 4096 16963 0 0 0 -1 ${cpu} 0 0 0 0 0 ` +
    `94110036241736 94110049791856 94110876078080 140724509464423 140724509464668 140724509464668 140724509466588 0`
  );
}

/**
 * The lines of a synthetic but well-formed vmsr-trace: every VM registered up front, half of each
 * VM's threads vCPUs over 2 virtual packages, ticks growing pseudo-randomly (deterministic), package
 * counters wrapping. Yields one line at a time so nothing big is held.
 */
export function* generateTraceLines(shape: GeneratedTraceShape): Generator<string> {
  const cpus = shape.cpus ?? 32;
  const npkg = shape.packages ?? 2;
  yield JSON.stringify({
    type: 'header',
    format: 'vmsr-trace',
    version: 1,
    clk_tck: 100,
    host: {
      vendor: 'intel',
      cpus: Array.from({ length: cpus }, (_, c) => ({ cpu: c, package: Math.floor((c * npkg) / cpus) })),
      packages: Array.from({ length: npkg }, (_, p) => ({ package: p, power_unit: '0xa0e03' })),
    },
    note: `generated: ${shape.vms} VMs x ${shape.threadsPerVm} threads x ${shape.samples} samples`,
  });
  const nvcpu = Math.max(1, Math.floor(shape.threadsPerVm / 2));
  for (let v = 0; v < shape.vms; v++) {
    const pid = 10_000 + v * 100;
    yield JSON.stringify({
      type: 'register',
      t_ns: 1_000_000_000,
      vm: { pid, starttime: 500, name: `vm-${v}`, vcpus: Array.from({ length: nvcpu }, (_, i) => ({ tid: pid + 1 + i, vpkg: i % 2 })) },
    });
  }
  let seed = 12345;
  const rand = (n: number): number => {
    seed = (seed * 1103515245 + 12345) % 2 ** 31;
    return seed % n;
  };
  const ticks = new Array<number>(shape.vms * shape.threadsPerVm).fill(0);
  const energy = new Array<number>(npkg).fill(2 ** 32 - 5_000_000);
  for (let s = 0; s < shape.samples; s++) {
    const tNs = 1_000_000_000 + (s + 1) * 1_000_000_000 + rand(20_000_000);
    for (let p = 0; p < npkg; p++) energy[p] = (energy[p]! + 900_000 + rand(200_000)) % 2 ** 32;
    const parts: string[] = [];
    for (let v = 0; v < shape.vms; v++) {
      const pid = 10_000 + v * 100;
      const threads: string[] = [];
      for (let k = 0; k < shape.threadsPerVm; k++) {
        const i = v * shape.threadsPerVm + k;
        ticks[i]! += rand(k >= 1 && k <= nvcpu ? 60 : 5);
        const tid = pid + k;
        const comm = k === 0 ? 'qemu-system-x86' : k <= nvcpu ? `CPU ${k - 1}/KVM` : 'worker';
        threads.push(`"${tid}":${JSON.stringify(stat(tid, comm, ticks[i]!, 500, rand(cpus)))}`);
      }
      parts.push(`"${pid}":{${threads.join(',')}}`);
    }
    const en = energy.map((e, p) => `"${p}":"0x${e.toString(16)}"`).join(',');
    yield `{"type":"sample","t_ns":${tNs},"energy":{${en}},"tasks":{${parts.join(',')}}}`;
  }
}

async function* asChunks(lines: Iterable<string>): AsyncGenerator<string> {
  for (const l of lines) yield l + '\n';
}

export async function run(shape: GeneratedTraceShape = { vms: 100, threadsPerVm: 10, samples: 600 }): Promise<void> {
  console.log(`\n== replay: ${shape.vms} VMs x ${shape.threadsPerVm} threads x ${shape.samples} samples (generated in memory)`);

  let bytes = 0;
  const counted = function* (): Generator<string> {
    for (const l of generateTraceLines(shape)) {
      bytes += l.length + 1;
      yield l;
    }
  };
  let t0 = process.hrtime.bigint();
  let intervals = 0;
  await replayRecords(readTraceStream(asChunks(counted())), () => intervals++);
  let s = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(
    `  generate + read + validate + engine: ${intervals} intervals in ${s.toFixed(2)} s = ${(intervals / s).toFixed(0)} intervals/s ` +
      `(${((shape.vms * shape.threadsPerVm * intervals) / s / 1e6).toFixed(2)} M stat lines/s, ${(bytes / 1e6).toFixed(0)} MB of trace)`,
  );

  // Engine alone: the records parsed beforehand, so only attribution (incl. stat-line parsing) is timed.
  const records: TraceRecord[] = [];
  for await (const r of readTraceStream(asChunks(generateTraceLines(shape)))) records.push(r);
  const header = records[0]!;
  if (header.type !== 'header') throw new Error('generated trace has no header');
  const engine = new RatioEngine(header.header.host);
  t0 = process.hrtime.bigint();
  intervals = 0;
  for (const r of records) {
    if (r.type === 'register') engine.register(r.vm);
    else if (r.type === 'sample' && engine.addSample(r.sample)) intervals++;
  }
  s = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(`  engine only: ${intervals} intervals in ${s.toFixed(2)} s = ${(intervals / s).toFixed(0)} intervals/s`);
}
