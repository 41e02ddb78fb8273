/**
 * DiscoveredVms with a real registry and a real ratio engine, no sockets. Discovery is a recorder:
 * scanSteps() gives the VMs a test puts in, refine() the vCPU list it sets, and it notes what is deferred.
 */
import { Writable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { pino } from 'pino';
import { RatioEngine } from '../../../src/ratio/attribution.js';
import type { HostInfo } from '../../../src/model/host.js';
import type { VcpuSpec } from '../../../src/model/vcpus.js';
import { VmRegistry, procView } from '../../../src/helper/v2/vm-registry.js';
import { DEFAULT_V2_LIMITS } from '../../../src/helper/v2/v2-limits.js';
import { DiscoveredVms } from '../../../src/helper/v2/discovered-vms.js';
import { VM_LOG_BURST } from '../../../src/helper/v2/vm-log.js';
import { LogLimiter } from '../../../src/logging/log-limiter.js';
import type { Discovery } from '../../../src/helper/v2/discovery.js';
import type { DiscoveredVm } from '../../../src/discovery/scanner.js';
import { fail, ok } from '../../../src/common/result.js';

const host: HostInfo = { vendor: 'intel', clkTck: 100, cpus: [{ cpu: 0, pkg: 0 }], packages: [{ pkg: 0, powerUnit: 0xa0e03n }] };

function found(pid: number, o: Partial<DiscoveredVm> = {}): DiscoveredVm {
  const topology = { cpus: 1, maxcpus: 1, sockets: 1, perSocket: 1 };
  return {
    pid,
    starttime: 1,
    uid: 0,
    name: `vm${pid}`,
    uuid: null,
    topology,
    wholeVmOnly: false,
    vcpus: [{ tid: pid, vpkg: 0 }],
    threads: 3,
    problems: [],
    ...o,
  };
}

function setup(room = true) {
  const registry = new VmRegistry(DEFAULT_V2_LIMITS, procView('/proc'));
  const engine = new RatioEngine(host);
  const lines: string[] = [];
  const log = pino(
    { level: 'info' },
    new Writable({
      write(chunk, _e, cb) {
        lines.push(String(chunk));
        cb();
      },
    }),
  );
  const scan: DiscoveredVm[] = [];
  const deferred: number[] = [];
  let refined: { vcpus: VcpuSpec[]; wholeVmOnly: boolean } | null = null;
  const discovery: Pick<Discovery, 'scanSteps' | 'refine' | 'defer'> = {
    scanSteps: () => scan.splice(0)[Symbol.iterator](),
    refine: () => refined,
    defer: (pid) => deferred.push(pid),
  };
  let changes = 0;
  const vms = new DiscoveredVms({
    discovery,
    registry,
    sampling: { engine, register: (spec) => engine.register(spec) },
    fds: { canAdmit: () => (room ? ok(undefined) : fail('no fds left')) },
    vmLog: new LogLimiter(log, VM_LOG_BURST),
    changed: () => changes++,
  });
  return {
    registry,
    engine,
    vms,
    scan,
    deferred,
    lines,
    changes: () => changes,
    refineTo: (r: typeof refined) => (refined = r),
  };
}

const sample = (pid: number) => ({ tNs: 1n, energy: new Map(), tasks: new Map([[pid, new Map([[pid, 'stat']])]]) });

describe('DiscoveredVms', () => {
  it('admits what the scan found: sampled, listed as discovered with its name, a change noted', async () => {
    const s = setup();
    s.scan.push(found(601));
    await s.vms.scanInSlices(() => false);
    const [r] = [...s.registry.all()];
    expect(r).toMatchObject({ pid: 601, owner: null, discovered: true, name: 'vm601', live: true });
    expect(s.engine.activePids()).toEqual([601]);
    expect(s.changes()).toBe(1);
  });

  it('gives a process a client registered already only its name and UUID: one process, one VM', async () => {
    const s = setup();
    const vmId = s.engine.register({ pid: 602, starttime: 1, vcpus: [{ tid: 602, vpkg: 0 }] });
    s.registry.add(1, vmId, { pid: 602, starttime: 1, vcpus: [] }, 0);
    s.scan.push(found(602, { uuid: Buffer.from([7]) }));
    await s.vms.scanInSlices(() => false);
    expect(s.registry.total).toBe(1);
    expect(s.registry.get(vmId)).toMatchObject({ owner: 1, discovered: true, name: 'vm602', uuid: Buffer.from([7]) });
    expect(s.changes()).toBe(0);
  });

  it('defers a VM whose threads do not fit the fd budget, warning once however often it is found', async () => {
    const s = setup(false);
    for (let i = 0; i < 3; i++) {
      s.scan.push(found(603));
      await s.vms.scanInSlices(() => false);
    }
    expect(s.registry.total).toBe(0);
    expect(s.deferred).toEqual([603, 603, 603]);
    expect(s.lines.filter((l) => l.includes('VM discovered but not sampled'))).toHaveLength(1);
  });

  it("takes a discovered VM's refined vCPU list, noting a change of whole-VM-only, unless a registrant holds it", async () => {
    const s = setup();
    s.scan.push(found(604));
    await s.vms.scanInSlices(() => false);
    const [r] = [...s.registry.all()];
    s.refineTo({ vcpus: [{ tid: 604, vpkg: 0 }], wholeVmOnly: true });
    s.vms.refine(sample(604));
    expect(r!.wholeVmOnly).toBe(true);
    expect(s.changes()).toBe(2);
    s.registry.add(1, r!.vmId, { pid: 604, starttime: 1, vcpus: [] }, 0);
    s.refineTo({ vcpus: [{ tid: 604, vpkg: 0 }], wholeVmOnly: true });
    s.vms.refine(sample(604));
    expect(r!.wholeVmOnly).toBe(false); // the registration's
    expect(s.changes()).toBe(2);
  });
});
