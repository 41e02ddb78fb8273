/**
 * Sampling cost with every RAPL domain against the package alone (goal: under 1.2x): CPU
 * time of one interval's sample and its attribution (Sampler.sample: energy read, then the VM threads'
 * stat lines from /proc; then RatioEngine.addSample with each process registered as a one-vCPU VM),
 * on a fake host of two packages of 16 CPUs, for the MSR source (one pread per package and domain)
 * and the powercap source (one pread per zone), with no VM thread but this process's and with 100 and
 * 1000 sleeping VM threads (python3 processes, as bench/sampling.ts). The energy part grows by one
 * pread per domain read (7 more here: 3 per package and PSYS once); what that is against a whole
 * interval depends on how many threads the interval reads. Repeats give the spread; the ratio is per
 * repeat.
 */
import { readHostInfoFor, withDomainCounters } from '../src/energy/create.js';
import { MsrEnergySource } from '../src/energy/msr-source.js';
import { readStarttime } from '../src/os/proc-starttime.js';
import { RatioEngine } from '../src/ratio/attribution.js';
import { PowercapEnergySource } from '../src/energy/powercap-source.js';
import type { EnergySource } from '../src/energy/energy-source.js';
import { MsrDevice } from '../src/msr/device.js';
import { MSR_DRAM_ENERGY_STATUS, MSR_PLATFORM_ENERGY_STATUS, MSR_PP0_ENERGY_STATUS, MSR_PP1_ENERGY_STATUS } from '../src/msr/registers.js';
import { readHostCpus } from '../src/msr/topology.js';
import { ProcTaskReader } from '../src/os/proc-tasks.js';
import { Sampler } from '../src/sampling/sampler.js';
import { FakeHost } from '../test/support/fake-host.js';
import type { ChildProcess } from 'node:child_process';
import { startProcs } from './sampling.js';
import { printTable, ratioText, spreadText } from './stats.js';

const REPEATS = 7;

/** µs of CPU per sample read and attributed over `n` samples. */
function perSample(sampler: Sampler, engine: RatioEngine, pids: number[], n: number): number {
  for (let i = 0; i < n / 10; i++) engine.addSample(sampler.sample(pids)); // warm up
  const a = process.cpuUsage();
  for (let i = 0; i < n; i++) engine.addSample(sampler.sample(pids));
  const d = process.cpuUsage(a);
  return (d.user + d.system) / n;
}

/** An engine for `source`'s host with every pid registered as a VM of one vCPU (its main thread). */
function engineFor(kind: 'msr' | 'powercap', source: EnergySource, h: FakeHost, device: MsrDevice, pids: number[]): RatioEngine {
  const host = withDomainCounters(readHostInfoFor(kind, { paths: h.hostPaths(), device, vendor: 'intel' }), source);
  const engine = new RatioEngine(host);
  for (const pid of pids) engine.register({ pid, starttime: readStarttime('/proc', pid) ?? 0, vcpus: [{ tid: pid, vpkg: 0 }] });
  return engine;
}

function fakeHost(): FakeHost {
  const h = new FakeHost({ packages: [...Array<number>(16).fill(0), ...Array<number>(16).fill(1)] });
  h.writeRapl({ powerUnit: 0xa0e03n, energy: { 0: 1000, 1: 1000 } });
  for (const pkg of [0, 1])
    for (const msr of [MSR_PP0_ENERGY_STATUS, MSR_PP1_ENERGY_STATUS, MSR_DRAM_ENERGY_STATUS, MSR_PLATFORM_ENERGY_STATUS])
      h.setCounter(h.cpusOf(pkg), msr, 1000);
  const max = 262143328850n;
  h.writePowercap([
    { id: '0', name: 'package-0', max, uj: 1n },
    { id: '0:0', name: 'core', max, uj: 1n },
    { id: '0:1', name: 'uncore', max, uj: 1n },
    { id: '0:2', name: 'dram', max, uj: 1n },
    { id: '1', name: 'psys', max, uj: 1n },
    { id: '2', name: 'package-1', max, uj: 1n },
    { id: '2:0', name: 'core', max, uj: 1n },
    { id: '2:1', name: 'uncore', max, uj: 1n },
    { id: '2:2', name: 'dram', max, uj: 1n },
  ]);
  return h;
}

export async function run(): Promise<void> {
  console.log(`\n== domains: CPU time of one sample, every RAPL domain vs the package alone (${REPEATS} repeats)`);
  const h = fakeHost();
  const device = new MsrDevice(h.msrPathTemplate);
  const cpus = readHostCpus(h.sysRoot);
  const make = {
    msr: (all: boolean): EnergySource =>
      new MsrEnergySource({ device, cpus, vendor: 'intel', sysRoot: h.sysRoot, ...(all ? {} : { domains: [] }) }),
    powercap: (all: boolean): EnergySource =>
      new PowercapEnergySource({ sysRoot: h.sysRoot, cpus, vendor: 'intel', ...(all ? {} : { domains: [] }) }),
  };
  const rows = [['source', 'VM threads', 'package only, us/sample', 'all 5 domains, us/sample', 'ratio all/package (goal < 1.2)']];
  let procs: ChildProcess[] = [];
  try {
    for (const threads of [0, 100, 1000]) {
      procs = threads > 0 ? await startProcs(threads) : [];
      const pids = threads > 0 ? procs.map((p) => p.pid!) : [process.pid];
      const n = threads >= 1000 ? 500 : threads > 0 ? 3000 : 20_000;
      for (const kind of ['msr', 'powercap'] as const) {
        const build = make[kind];
        const tasks = new ProcTaskReader('/proc');
        const pkgOnly = build(false);
        const all = build(true);
        const [a, b] = [new Sampler(pkgOnly, tasks), new Sampler(all, tasks)];
        const only: number[] = [];
        const every: number[] = [];
        const [ea, eb] = [engineFor(kind, pkgOnly, h, device, pids), engineFor(kind, all, h, device, pids)];
        for (let r = 0; r < REPEATS; r++) {
          only.push(perSample(a, ea, pids, n));
          every.push(perSample(b, eb, pids, n));
        }
        rows.push([
          kind,
          threads === 0 ? "(the bench's own)" : String(threads),
          spreadText(only, 1),
          spreadText(every, 1),
          ratioText(every, only),
        ]);
        pkgOnly.close();
        all.close();
        tasks.close();
      }
      for (const p of procs) p.kill();
    }
    printTable(rows);
  } finally {
    for (const p of procs) p.kill();
    device.close();
    h.cleanup();
  }
}
