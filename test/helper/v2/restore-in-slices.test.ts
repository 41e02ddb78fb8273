/**
 * The v2 service restores a snapshot's discovered VMs in slices (docs/daemon.md "Where the time goes"):
 * re-reading each VM's threads is the long part of a restart's v2 set-up, and the daemon serves QEMU
 * meanwhile. Real fake-QEMU processes, the real ProcScanner (its adopt() watched, not replaced), the
 * real MSR energy source on a FakeHost.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { pino } from 'pino';
import { assembleV2, type V2Chain } from '../../../src/helper/assemble.js';
import { createV2Service, type V2Service } from '../../../src/helper/v2/service.js';
import { DEFAULT_V2_LIMITS } from '../../../src/helper/v2/v2-limits.js';
import { ProcScanner } from '../../../src/discovery/scanner.js';
import { createEnergySource } from '../../../src/energy/create.js';
import { ProcTaskReader } from '../../../src/os/proc-tasks.js';
import { Sampler } from '../../../src/sampling/sampler.js';
import { MsrDevice } from '../../../src/msr/device.js';
import { SLICE_BUDGET_MS } from '../../../src/sampling/time-slices.js';
import { FakeHost } from '../../support/fake-host.js';
import { FakeQemuFarm } from '../../support/fake-qemu.js';
import { waitFor } from '../../support/wait.js';
import { countTurns } from '../../support/turns.js';

const VMS = 40;
/** Each adopt is made to take at least this long, so the VMs take several slices (SLICE_BUDGET_MS each) whatever the machine. */
const ADOPT_AT_LEAST_MS = 0.25;

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

describe('restoring the v2 service', () => {
  it('adopts the discovered VMs over several turns of the event loop, every one of them, and samples only once they are all adopted', async () => {
    expect(VMS * ADOPT_AT_LEAST_MS).toBeGreaterThan(4 * SLICE_BUDGET_MS);
    const farm = new FakeQemuFarm(VMS, 2);
    cleanups.push(() => farm.kill());
    const pids = new Set(await farm.ready());
    const fake = new FakeHost({ packages: [0] });
    fake.writeRapl({ powerUnit: 0xa0e03n, energy: { 0: 0 } });
    const device = new MsrDevice(fake.msrPathTemplate);
    cleanups.push(
      () => fake.cleanup(),
      () => device.close(),
    );
    const log = pino({ level: 'silent' });
    const paths = fake.hostPaths();
    const before: V2Chain = await assembleV2({
      paths,
      device,
      vendor: 'intel',
      intervalMs: 50,
      limits: DEFAULT_V2_LIMITS,
      log,
      discovery: true,
    });
    cleanups.push(() => before.close());
    const ours = () => before.service.snapshot().vms.filter((v) => pids.has(v.pid) && v.live).length;
    await waitFor(() => ours() === VMS, `the ${VMS} fake VMs discovered`, undefined, 30_000);
    const saved = before.service.snapshot();
    await before.close();

    // The next service: its scanner's adopt() notes the turn of the event loop each call runs in.
    const turns = countTurns();
    cleanups.push(() => turns.stop());
    const scanner = new ProcScanner(paths.procRoot, { clkTck: before.host.clkTck });
    const adoptedIn: number[] = [];
    const adopt = scanner.adopt.bind(scanner);
    scanner.adopt = (pid, starttime) => {
      const end = performance.now() + ADOPT_AT_LEAST_MS;
      while (performance.now() < end);
      if (pids.has(pid)) adoptedIn.push(turns.now());
      return adopt(pid, starttime);
    };
    const tasks = new ProcTaskReader(paths.procRoot);
    const energy = createEnergySource('msr', { host: before.host, paths, device });
    cleanups.push(
      () => tasks.close(),
      () => energy.close(),
    );
    // The first sample after a restore closes the old process's last interval: it must see every VM adopted.
    const sampler = new Sampler(energy, tasks);
    let restoring = true;
    let sampledWhileRestoring = false;
    const sampleSteps = sampler.sampleSteps.bind(sampler);
    sampler.sampleSteps = (pids) => {
      sampledWhileRestoring ||= restoring;
      return sampleSteps(pids);
    };
    const after: V2Service = await createV2Service({
      host: before.host,
      sampler,
      procRoot: paths.procRoot,
      intervalMs: 50,
      limits: DEFAULT_V2_LIMITS,
      log,
      discovery: scanner,
      deferDiscovery: true,
      restore: saved,
    });
    restoring = false;
    cleanups.push(() => after.close());
    turns.stop();

    expect(after.restored).toMatchObject({ ok: true });
    expect(adoptedIn).toHaveLength(VMS);
    // In one go, every adopt would have run in the same turn.
    expect(adoptedIn.at(-1)! - adoptedIn[0]!).toBeGreaterThanOrEqual(2);
    expect(after.snapshot().vms.filter((v) => pids.has(v.pid) && v.live && v.discovered)).toHaveLength(VMS);
    expect(sampledWhileRestoring).toBe(false);
    await waitFor(() => after.stats.samples >= 1, 'the first sample after the restore');
  });
});
