/**
 * The limit table and per-sample loop (src/power-limit/limiter.ts) on a bandwidth stand-in that records
 * what it is told (the interface the cgroups sit behind): nothing is opened for a VM under its limit,
 * the log says when a limit starts and stops biting, and every way a limit ends gives the quota back.
 */
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { PowerLimiter } from '../../src/power-limit/limiter.js';
import type { BandwidthOpener } from '../../src/power-limit/cpu-bandwidth.js';
import type { HeldGroupState } from '../../src/state/snapshot.js';
import type { IntervalResult, VmTotals } from '../../src/ratio/outputs.js';

/** A VM of one vCPU (tid 11) whose ticks grow by `cpu` x 100 per 1 s interval, drawing `watts`. */
function world(vms: Map<number, { ticks: number }>) {
  const opened: number[] = [];
  const carried: (readonly HeldGroupState[] | undefined)[] = [];
  const sets: number[] = [];
  let released = 0;
  const open: BandwidthOpener = (pid, _tids, from) => {
    opened.push(pid);
    carried.push(from);
    let written: string | null = null;
    return {
      groups: [`/g${pid}`],
      set: (cpus) => (sets.push(cpus), (written = `${Math.round(cpus * 100000)}\n`), { quotaUs: cpus * 100000, periodUs: 100000 }),
      release: () => void released++,
      state: () => [{ dir: `/g${pid}`, saved: '-1\n', written, made: false }],
    };
  };
  const lines: string[] = [];
  const log = pino(
    { level: 'info' },
    new Writable({ write: (c: Buffer, _e, cb) => (lines.push(String(JSON.parse(String(c)).msg)), cb()) }),
  );
  const limiter = new PowerLimiter({
    open,
    log,
    clkTck: 100,
    domains: ['package', 'dram'],
    totalsInto: (vmId: number, into: VmTotals) => {
      const v = vms.get(vmId);
      if (!v) return false;
      into.vcpus = [{ tid: 11, energyJ: 0, ticks: v.ticks }];
      return true;
    },
  });
  /** One 1 s interval of a VM drawing `watts` of package power (and `dramW` of DRAM power, when given) at `cpu` CPUs. */
  const sample = (vmId: number, watts: number, cpu: number, ended: number[] = [], dramW?: number) => {
    vms.get(vmId)!.ticks += cpu * 100;
    const domains = dramW === undefined ? {} : { domains: [{ domain: 'dram' as const, vpkgEnergyJ: [dramW / 2, dramW / 2] }] };
    const r: IntervalResult = {
      tNs: 0n,
      dtS: 1,
      packages: [],
      vms: [{ vmId, pid: 100 + vmId, vpkgEnergyJ: [watts], ...domains }],
      ended: [],
      problems: [],
    };
    limiter.sample(r, ended);
  };
  return { limiter, sample, opened, carried, sets, lines, released: () => released, open };
}

describe('power limiter', () => {
  it('opens nothing for a VM that stays under its limit, and starts and stops biting with a log line each time when it goes over and back', () => {
    const w = world(new Map([[1, { ticks: 0 }]]));
    expect(w.limiter.set(1, 101, 30)).toBeNull();
    for (let i = 0; i < 5; i++) w.sample(1, 20, 1);
    expect(w.opened).toEqual([]);
    expect(w.limiter.view(1)).toEqual({ domain: 'package', limitW: 30, quotaUs: null, periodUs: 0, limitedS: 0 });
    w.sample(1, 60, 1);
    expect(w.opened).toEqual([101]);
    expect(w.lines.some((l) => l === 'power limit of VM 1 starts biting: package power 60.0 W over 30 W')).toBe(true);
    // The guest goes idle: the quota climbs back to the whole vCPU and is let go.
    for (let i = 0; i < 10 && w.released() === 0; i++) w.sample(1, 5, 0.1);
    expect(w.released()).toBe(1);
    expect(w.lines.some((l) => l.startsWith('power limit of VM 1 stops biting: package power 5.0 W stays under the limit of 30 W'))).toBe(
      true,
    );
    expect(w.limiter.view(1)!.quotaUs).toBeNull();
    expect(w.limiter.view(1)!.limitedS).toBeGreaterThan(0);
  });

  for (const end of ['removed', 'ended', 'forgotten', 'closed'] as const)
    it(`gives the quota back when the limit is ${end}`, () => {
      const w = world(new Map([[1, { ticks: 0 }]]));
      w.limiter.set(1, 101, 30);
      w.sample(1, 60, 1);
      expect(w.sets).toHaveLength(1);
      if (end === 'removed') w.limiter.set(1, 101, null);
      if (end === 'ended') w.sample(1, 60, 1, [1]);
      if (end === 'forgotten') w.limiter.forget(1);
      if (end === 'closed') w.limiter.close();
      expect(w.released()).toBe(1);
      expect(w.limiter.view(1) === undefined).toBe(end !== 'closed');
    });

  it('refuses limits that are not above 0 W or past the bound, and says once why a limit cannot be applied', () => {
    const w = world(new Map([[1, { ticks: 0 }]]));
    for (const bad of [0, -1, NaN, 5e6]) expect(w.limiter.set(1, 101, bad)).toMatch(/a limit is more than 0 and at most 4000000 W/);
    const failing = new PowerLimiter({
      open: () => {
        throw new Error('cannot limit the power of the VM of pid 101: EACCES');
      },
      log: pino({ level: 'silent' }),
      clkTck: 100,
      domains: ['package', 'dram'],
      totalsInto: (_id: number, into: VmTotals) => ((into.vcpus = [{ tid: 11, energyJ: 0, ticks: 0 }]), true),
    });
    failing.set(1, 101, 10);
    const r: IntervalResult = { tNs: 0n, dtS: 1, packages: [], vms: [{ vmId: 1, pid: 101, vpkgEnergyJ: [50] }], ended: [], problems: [] };
    failing.sample(r, []);
    failing.sample(r, []);
    expect(failing.view(1)!.problem).toBe('cannot limit the power of the VM of pid 101: EACCES');
  });

  it('goes on after a restart or a crash from the state it carried: the same limits, the quota in force where it was, its groups adopted with their bytes from before', () => {
    const vms = new Map([
      [1, { ticks: 0 }],
      [2, { ticks: 0 }],
    ]);
    const w = world(vms);
    w.limiter.set(1, 101, 30);
    w.limiter.set(1, 101, 8, true, 'dram');
    w.limiter.set(2, 102, 50, true);
    for (let i = 0; i < 3; i++) w.sample(1, 60, 1, [], 4);
    const saved = w.limiter.state();
    expect(saved.map((s) => [s.vmId, s.domain, s.limitW, s.fromFile, s.groups.length])).toEqual([
      [1, 'package', 30, false, 1],
      [1, 'dram', 8, true, 0],
      [2, 'package', 50, true, 0],
    ]);
    const quota = w.limiter.view(1)!.quotaUs;
    // The next process: the same VMs known again (and one that is not: left).
    const next = world(vms);
    next.limiter.restore([...saved, { ...saved[2]!, vmId: 3 }]);
    expect(next.limiter.limited()).toEqual([
      [1, 'package'],
      [1, 'dram'],
      [2, 'package'],
    ]);
    expect(next.limiter.limited(true)).toEqual([
      [1, 'dram'],
      [2, 'package'],
    ]);
    expect(next.carried).toEqual([saved[0]!.groups]);
    expect(next.limiter.view(1)).toMatchObject({ limitW: 30, quotaUs: quota });
    expect(next.limiter.view(1)!.limitedS).toBe(w.limiter.view(1)!.limitedS);
    expect(next.released()).toBe(0);
    next.limiter.set(1, 101, null, false, 'dram');
    next.limiter.set(1, 101, null);
    expect(next.released()).toBe(1);
  });

  it("steers the quota on a named domain's attributed power, and with two limits on one VM the lower quota wins, whichever domain asks it", () => {
    // The family: a VM whose package power (p W per CPU) and DRAM power (d W per CPU) follow its CPU
    // time; limits on one or both domains at several levels. Held, the VM settles where the binding one says.
    for (const [pkgPerCpu, dramPerCpu, pkgLimit, dramLimit] of [
      [60, 10, null, 5],
      [60, 10, 40, 5],
      [60, 10, 20, 8],
      [40, 20, 35, 6],
    ] as const) {
      const w = world(new Map([[1, { ticks: 0 }]]));
      if (pkgLimit !== null) expect(w.limiter.set(1, 101, pkgLimit)).toBeNull();
      expect(w.limiter.set(1, 101, dramLimit, false, 'dram')).toBeNull();
      let cpu = 1;
      for (let i = 0; i < 30; i++) {
        w.sample(1, pkgPerCpu * cpu, cpu, [], dramPerCpu * cpu);
        cpu = Math.min(1, w.limiter.view(1, 'dram')!.quotaUs === null ? 1 : w.limiter.view(1, 'dram')!.quotaUs! / 100000);
      }
      // The quota each limit alone would hold (power follows CPU time linearly here).
      const want = Math.min(dramLimit / dramPerCpu, pkgLimit === null ? 1 : pkgLimit / pkgPerCpu);
      expect(cpu).toBeGreaterThan(want * 0.95);
      expect(cpu).toBeLessThan(want * 1.05);
      const binding = pkgLimit !== null && pkgLimit / pkgPerCpu < dramLimit / dramPerCpu ? 'package' : 'dram';
      expect(w.lines.some((l) => l.startsWith(`power limit of VM 1 starts biting: ${binding} power`))).toBe(true);
      expect(w.limiter.views(1).map((v) => v.domain)).toEqual(pkgLimit === null ? ['dram'] : ['package', 'dram']);
      // Removing the binding limit leaves the other in force (the VM is not let go while it is over it).
      w.limiter.set(1, 101, null, false, binding);
      expect(w.limiter.views(1)).toHaveLength(pkgLimit === null ? 0 : 1);
    }
  });

  it('refuses a limit on a domain the helper does not attribute, saying which it does, and counts each VM and domain against the bound', () => {
    const w = world(new Map([[1, { ticks: 0 }]]));
    for (const d of ['core', 'uncore', 'psys'] as const)
      expect(w.limiter.set(1, 101, 5, false, d)).toBe(
        `this host's helper does not attribute ${d} power (it attributes package, dram); limit one of those`,
      );
    expect(w.limiter.views(1)).toEqual([]);
    expect(w.limiter.set(1, 101, 5, false, 'dram')).toBeNull();
    expect(w.limiter.set(1, 101, 50)).toBeNull();
    expect(w.limiter.limited()).toEqual([
      [1, 'dram'],
      [1, 'package'],
    ]);
  });
});
