/**
 * The publisher alone (src/guest-dir/), in this process: GuestDirs.sample() for 500 VMs of one virtual
 * package with package, core, DRAM and PSYS zones (or the package alone), each zone's value changed at
 * every sample (a busy host: the worst case, every energy_uj written anew) in each VM's totals (moved
 * here, as the engine moves them for the daemon's writer), into directories on tmpfs. CPU of this process per sample (user + system), after a
 * warm-up. The daemon suite (guestdir.ts) measures the whole daemon, whose stand-in VMs gain no energy;
 * this one measures what writing the files costs when they do (the daemon suite adds it to its own).
 * VMSR_GUEST_DIR_SWAP=0 measures the writer that makes a new file at every update (safe-dir.ts).
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { GuestDirs, type GuestDirSource, type GuestDirVm } from '../src/guest-dir/guest-dirs.js';
import { encodeStatsFile } from '../src/protocol/stats/layout.js';
import { vmStatsLayout, type VmStatsShape } from '../src/protocol/stats/vm-file.js';
import { emptyVmTotals, type VmTotals } from '../src/ratio/outputs.js';

const VMS = 500;
const WARMUP = 200;
const SAMPLES = 400;

/** Each VM's statistics file in its guest directory: the totals it is written from (null: not made), and its copy. */
type BenchStats = ({ totals: VmTotals; copy: { valuesWritten: number } } | null)[];

function source(vms: GuestDirVm[], stats: BenchStats, shape: VmStatsShape): GuestDirSource {
  const layout = vmStatsLayout(shape);
  return {
    vms: () => vms,
    statsCopy: (vmId, map) => {
      map(encodeStatsFile(layout));
      const totals = emptyVmTotals();
      totals.energyUj = [0];
      totals.domains = shape.domains.map((domain) => ({ domain, energyUj: [0] }));
      const copy = { shape, totals, current: true, valuesWritten: 0, close: () => (stats[vmId] = null) };
      stats[vmId] = { totals, copy };
      return copy;
    },
    inGroup: () => false,
    readers: (uid) => ({ uid, gid: null }),
  };
}

/** µs of CPU per sample for `n` samples, each moving every zone's energy when `busy` (in each VM's statistics file, as the daemon writes it). */
function measure(g: GuestDirs, stats: BenchStats, n: number, busy: boolean): { total: number; sys: number } {
  const c0 = process.cpuUsage();
  for (let i = 0; i < n; i++) {
    if (busy)
      for (const f of stats) {
        if (!f) continue;
        f.totals.energyUj[0]! += 1000;
        for (const d of f.totals.domains) d.energyUj[0]! += 1000;
        f.copy.valuesWritten++;
      }
    g.sample();
  }
  const c = process.cpuUsage(c0);
  return { total: (c.user + c.system) / n, sys: c.system / n };
}

/** The publisher's CPU per sample (µs), every zone changing (`busy`) or none, with every domain or the package alone. */
export function writerCost(busy: boolean, allDomains = true): { total: number; sys: number } {
  const shm = fs.existsSync('/dev/shm') ? '/dev/shm' : os.tmpdir();
  const root = fs.mkdtempSync(path.join(shm, 'vmsr-bench-writer-'));
  const vms: GuestDirVm[] = [];
  const domainNames = allDomains ? (['core', 'dram', 'psys'] as const) : [];
  for (let k = 0; k < VMS; k++) {
    fs.mkdirSync(path.join(root, `vm-${k}`));
    vms.push({ vmId: k, uuid: null, name: `vm-${k}`, pid: 1, uid: 0, live: true });
  }
  const shape = { hostVmId: 1, pid: 1, name: 'x', nvpkg: 1, nvcpu: 8, tickExponent: -2, domains: [...domainNames] };
  const stats: BenchStats = vms.map(() => null);
  const g = new GuestDirs(root, source(vms, stats, shape), pino({ level: 'silent' }));
  try {
    measure(g, stats, WARMUP, busy);
    return measure(g, stats, SAMPLES, busy);
  } finally {
    g.close();
    fs.rmSync(root, { recursive: true, force: true });
  }
}

export function run(): void {
  console.log(`\n== guestdir-writer: the publisher alone, ${VMS} VMs and a statistics file each, CPU per sample`);
  for (const allDomains of [true, false])
    for (const busy of [true, false]) {
      const r = writerCost(busy, allDomains);
      const zones = allDomains ? '4 zones' : 'the package zone';
      const what = busy ? 'every zone changed at every sample' : 'no zone changed (idle VMs)';
      console.log(
        `${zones}, ${what}: ${r.total.toFixed(0)} us (${r.sys.toFixed(0)} in the kernel), ${(r.total / VMS).toFixed(1)} us per VM`,
      );
    }
}
