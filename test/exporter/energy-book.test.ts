/** The exporter's book: exporter-side totals, ended VMs scraped once more, the VM cap, reconnections. */
import fc from 'fast-check';
import { describe, expect, test } from 'vitest';
import { EnergyBook } from '../../src/exporter/energy-book.js';
import type { HostUpdate, VmInfo } from '../../src/client/v2-replies.js';
import { RunningTotal, ujToJoules } from '../../src/exporter/running-total.js';

function vm(hostVmId: number, pid: number, o: Partial<VmInfo> = {}): VmInfo {
  return {
    hostVmId,
    pid,
    uid: 0,
    starttime: 1000n,
    name: `vm${pid}`,
    uuid: null,
    source: 'discovered',
    nvpkg: 1,
    ended: false,
    wholeVmOnly: false,
    ...o,
  };
}
const hostUpd = (tNs: bigint, o: Partial<HostUpdate> = {}): HostUpdate => ({
  tNs,
  packages: [],
  unattributedUj: 0n,
  vmsChanged: false,
  stats: stats(0n),
  ...o,
});
function stats(ok: bigint) {
  return {
    legacyOk: ok,
    legacyRefused: 1n,
    legacyFailed: 0n,
    lastSampleDurationNs: 2_500_000n,
    samples: 10n,
    sampleFailures: 1n,
    connections: 3,
    vms: 2,
  };
}
const upd = (hostVmId: number, tNs: bigint, uj: bigint[], ended = false) => ({
  hostVmId,
  tNs,
  ended,
  vpkgs: uj.map((energyUj) => ({ counter: 0n, energyUj })),
});

describe('RunningTotal', () => {
  test('adds increases, and a value below the last one whole (a new daemon run)', () => {
    const t = new RunningTotal();
    expect(t.feed(100n)).toBe(100n);
    expect(t.feed(150n)).toBe(50n);
    expect(t.feed(150n)).toBe(0n);
    expect(t.feed(30n)).toBe(30n); // daemon restarted: 30 new
    expect(t.feed(40n)).toBe(10n);
    expect(t.total).toBe(190n);
  });
  test('never decreases, whatever the daemon sends', () => {
    fc.assert(
      fc.property(fc.array(fc.bigInt({ min: -5n, max: 1n << 50n })), (values) => {
        const t = new RunningTotal();
        let prev = 0n;
        for (const v of values) {
          t.feed(v);
          expect(t.total >= prev).toBe(true);
          prev = t.total;
        }
      }),
    );
  });
  test('joules keep every microjoule', () => {
    expect(ujToJoules(1_234_567_891n)).toBe(1234.567891);
    expect(ujToJoules(0n)).toBe(0);
  });
});

describe('EnergyBook', () => {
  test('a VM is observed once per connection, its energy totals and power follow its updates', () => {
    const b = new EnergyBook();
    b.connectionStarted();
    expect(b.listed([vm(1, 100, { nvpkg: 2 })]).observe.map((v) => v.hostVmId)).toEqual([1]);
    expect(b.listed([vm(1, 100, { nvpkg: 2 })]).observe).toEqual([]); // already observed
    b.vmUpdate(upd(1, 0n, [0n, 0n]));
    b.vmUpdate(upd(1, 1_000_000_000n, [2_000_000n, 500_000n]));
    b.vmUpdate(upd(1, 2_000_000_000n, [5_000_000n, 500_000n]));
    const [r] = b.exposed();
    expect(r!.energy.map((t) => t.total)).toEqual([5_000_000n, 500_000n]);
    expect(r!.watts).toEqual([3, 0]);
    expect(r!.labels).toEqual({ name: 'vm100', uuid: '', pid: '100', uid: '0' });
  });

  test("books a process wearing a VM's name and UUID apart from that VM, each under its owner uid", () => {
    const b = new EnergyBook();
    b.connectionStarted();
    const uuid = '6f1c1a7e-0000-4000-8000-000000000001';
    const real = vm(1, 100, { name: 'web', uuid, uid: 64055 });
    const fake = vm(2, 200, { name: 'web', uuid, uid: 65534 });
    expect(b.listed([real, fake]).observe.map((v) => v.hostVmId)).toEqual([1, 2]);
    b.vmUpdate(upd(1, 1n, [7_000_000n]));
    b.vmUpdate(upd(2, 1n, [3_000_000n]));
    expect(b.exposed().map((r) => [r.labels, r.energy[0]!.total])).toEqual([
      [{ name: 'web', uuid, pid: '100', uid: '64055' }, 7_000_000n],
      [{ name: 'web', uuid, pid: '200', uid: '65534' }, 3_000_000n],
    ]);
  });

  test('an ended VM is exposed by one more scrape, then forgotten', async () => {
    const b = new EnergyBook();
    b.connectionStarted();
    b.listed([vm(1, 100), vm(2, 200)]);
    b.vmUpdate(upd(1, 1n, [7n], true));
    expect(b.exposed().map((r) => r.labels.pid)).toEqual(['100', '200']);
    const seen = await b.scrape(async () => b.exposed().map((r) => r.labels.pid));
    expect(seen).toEqual(['100', '200']);
    expect(b.exposed().map((r) => r.labels.pid)).toEqual(['200']);
  });

  test('an ended VM nobody scrapes is forgotten after the retention time', () => {
    let now = 0;
    const b = new EnergyBook({ maxExportedVms: 10, endedRetentionMs: 1000 }, () => now);
    b.connectionStarted();
    b.listed([vm(1, 100)]);
    b.listed([]); // gone from the LIST: ended
    now = 999;
    b.hostUpdate(hostUpd(1n));
    expect(b.size).toBe(1);
    now = 1000;
    b.hostUpdate(hostUpd(2n));
    expect(b.size).toBe(0);
  });

  test('over maxExportedVms, VMs are skipped and counted; a label set in use twice is skipped', () => {
    const b = new EnergyBook({ maxExportedVms: 2, endedRetentionMs: 1000 });
    b.connectionStarted();
    const r = b.listed([vm(1, 100), vm(2, 200), vm(3, 300), vm(4, 100)]);
    expect(r.observe.map((v) => v.hostVmId)).toEqual([1, 2]);
    expect(r.skipped.map((v) => v.hostVmId)).toEqual([3, 4]);
    expect(b.health.vmsSkipped).toBe(2);
  });

  test('after a reconnection the same VM keeps its series and its total grows from the new run', () => {
    const b = new EnergyBook();
    b.connectionStarted();
    b.listed([vm(1, 100)]);
    b.vmUpdate(upd(1, 1_000n, [9_000_000n]));
    b.connectionLost();
    b.connectionStarted();
    // The restarted daemon numbers VMs anew and counts from 0.
    expect(b.listed([vm(7, 100)]).observe.map((v) => v.hostVmId)).toEqual([7]);
    b.vmUpdate(upd(7, 0n, [0n]));
    b.vmUpdate(upd(7, 5_000n, [1_000_000n]));
    expect(b.exposed()[0]!.energy[0]!.total).toBe(10_000_000n);
    // Updates for the old connection's id are ignored.
    b.vmUpdate(upd(1, 6_000n, [50_000_000n]));
    expect(b.exposed()[0]!.energy[0]!.total).toBe(10_000_000n);
  });

  test('a VM the LIST after a reconnection does not name has ended', () => {
    const b = new EnergyBook();
    b.connectionStarted();
    b.listed([vm(1, 100), vm(2, 200)]);
    b.connectionLost();
    b.connectionStarted();
    b.listed([vm(1, 200)]);
    const ended = b
      .exposed()
      .filter((r) => r.endedAtMs !== null)
      .map((r) => r.labels.pid);
    expect(ended).toEqual(['100']);
  });

  test('a VM missing from the LIST after a daemon restart resumes its totals when the same process is listed again, even after its last scrape', async () => {
    let now = 0;
    const b = new EnergyBook({ maxExportedVms: 10, endedRetentionMs: 60_000 }, () => now);
    b.connectionStarted();
    b.listed([vm(1, 100)]);
    b.vmUpdate(upd(1, 1_000n, [9_000_000n]));
    b.connectionLost();
    b.connectionStarted();
    b.listed([]); // restarted daemon: not registered again yet
    await b.scrape(async () => undefined); // its last scrape: no longer exposed
    expect(b.exposed()).toEqual([]);
    now = 30_000;
    b.listed([vm(4, 100)]); // registered again: same pid and starttime
    b.vmUpdate(upd(4, 0n, [0n]));
    b.vmUpdate(upd(4, 2_000n, [1_000_000n]));
    expect(b.exposed().map((r) => r.energy[0]!.total)).toEqual([10_000_000n]);
    // Another process under those labels, or the same one after the retention time, starts afresh.
    b.listed([]);
    await b.scrape(async () => undefined);
    now = 100_000;
    b.listed([vm(5, 100)]);
    b.vmUpdate(upd(5, 3_000n, [7n]));
    expect(b.exposed().map((r) => r.energy[0]!.total)).toEqual([7n]);
  });

  test('host packages, unattributed energy and legacy counts accumulate; sample age is on the monotonic clock', () => {
    let mono = 0n;
    const b = new EnergyBook(undefined, Date.now, () => mono);
    expect(b.lastSampleAgeS()).toBeNull();
    b.hostUpdate(
      hostUpd(1_000_000_000n, {
        packages: [
          { pkg: 0, energyUj: 10n, unattributedUj: 4n },
          { pkg: 1, energyUj: 20n, unattributedUj: 1n },
        ],
        unattributedUj: 5n,
        stats: stats(4n),
      }),
    );
    b.hostUpdate(
      hostUpd(2_000_000_000n, {
        packages: [
          { pkg: 0, energyUj: 15n, unattributedUj: 4n },
          { pkg: 1, energyUj: 21n, unattributedUj: 2n },
        ],
        unattributedUj: 6n,
        stats: stats(9n),
      }),
    );
    mono = 4_500_000_000n;
    expect(b.packages.get(0)!.total).toBe(15n);
    expect(b.packages.get(1)!.total).toBe(21n);
    expect(b.packageUnattributed.get(0)!.total).toBe(4n);
    expect(b.packageUnattributed.get(1)!.total).toBe(2n);
    expect(b.unattributed.total).toBe(6n);
    expect(b.health.legacy.ok.total).toBe(9n);
    expect(b.health.daemonConnections).toBe(3);
    expect(b.health.lastSampleDurationS).toBe(0.0025);
    expect(b.lastSampleAgeS()).toBe(2.5);
  });

  test('a VM listed under a new id for the same process keeps its series; a registration taking it over makes it registered', () => {
    const b = new EnergyBook();
    b.connectionStarted();
    b.listed([vm(1, 100, { nvpkg: 2 })]);
    b.vmUpdate(upd(1, 1n, [1_000n, 2_000n]));
    // Same id, now registered with one virtual package.
    expect(b.listed([vm(1, 100, { source: 'registered', nvpkg: 1 })]).observe).toEqual([]);
    b.vmUpdate(upd(1, 2n, [1_500n]));
    expect(b.exposed()[0]!.source).toBe('registered');
    expect(b.exposed()[0]!.energy.map((t) => t.total)).toEqual([1_500n]);
    // A new id for the same process: observed, same record, totals go on.
    expect(b.listed([vm(9, 100)]).observe.map((v) => v.hostVmId)).toEqual([9]);
    b.vmUpdate(upd(9, 3n, [1_800n]));
    expect(b.exposed().map((r) => [r.endedAtMs, r.energy[0]!.total])).toEqual([[null, 1_800n]]);
  });

  test('a new process under the same labels (pid reused) starts its totals afresh', () => {
    const b = new EnergyBook();
    b.connectionStarted();
    b.listed([vm(1, 100)]);
    b.vmUpdate(upd(1, 1n, [9_000_000n], true));
    b.listed([vm(2, 100, { starttime: 5000n })]);
    b.vmUpdate(upd(2, 2n, [1_000n]));
    expect(b.exposed().map((r) => [r.starttime, r.energy[0]!.total])).toEqual([[5000n, 1_000n]]);
  });
});

describe('the other RAPL domains in the book', () => {
  test("a VM's and the host's domain totals go on across a daemon restart, and a VM's domain power is dropped with its package power", () => {
    const b = new EnergyBook();
    b.connectionStarted();
    b.listed([vm(1, 500)]);
    const dram = (uj: bigint, w: number) => [{ domain: 'dram' as const, energyUj: [uj], powerW: [w] }];
    b.vmUpdate(upd(1, 1n, [1000n]), [1], dram(300n, 0.5));
    b.vmUpdate(upd(1, 2n, [1500n]), [1], dram(400n, 0.25));
    b.hostUpdate(hostUpd(2n), [{ domain: 'dram', pkg: 0, energyUj: 900n, unattributedUj: 500n }]);
    const r = b.exposed()[0]!;
    expect(r.domainEnergy.get('dram')!.map((t) => t.total)).toEqual([400n]);
    expect(r.domainWatts.get('dram')).toEqual([0.25]);
    // The daemon restarts: its values start again from 0; the book's totals go on from where they were.
    b.connectionLost();
    expect(r.domainWatts.get('dram')).toEqual([null]);
    b.connectionStarted();
    b.listed([vm(7, 500)]);
    b.vmUpdate(upd(7, 1n, [10n]), [1], dram(20n, 0.125));
    b.hostUpdate(hostUpd(1n), [{ domain: 'dram', pkg: 0, energyUj: 50n, unattributedUj: 30n }]);
    expect(r.domainEnergy.get('dram')!.map((t) => t.total)).toEqual([420n]);
    expect(b.domainPackages.get('dram')!.get(0)!.total).toBe(950n);
    expect(b.domainPackageUnattributed.get('dram')!.get(0)!.total).toBe(530n);
    expect(b.domainUnattributed.get('dram')!.total).toBe(530n);
    // The VM ends: no power for any domain, its energy stays for the last scrape.
    b.vmUpdate(upd(7, 2n, [11n], true), [1], dram(21n, 0.125));
    expect(r.domainWatts.get('dram')).toEqual([null]);
    expect(r.domainEnergy.get('dram')!.map((t) => t.total)).toEqual([421n]);
  });
});
