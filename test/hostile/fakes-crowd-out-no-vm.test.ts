/**
 * Fake QEMUs of one unprivileged user used to take every discovery slot (4,200 fakes, 4,096 slots:
 * a real VM started later was never discovered, and nothing was logged at warn), or the daemon's
 * fds (10 fakes of 1,000 threads took 18,030 of 20,000: a real VM was "discovered but not sampled"
 * and its REGISTER got ERROR 4). Now one uid that is neither root nor in --socket-group holds at
 * most a quarter of either, a full share is a warning naming the option to raise, and a root VM
 * started after the flood is discovered, registered and sampled. The fakes are real processes of
 * uid nobody, the daemon the real one dropped to -u nobody; both attacks are scaled down with the
 * cap (--max-discovered-vms) or the open-file limit, keeping the attack's ratio.
 */
import { describe, expect, test } from 'vitest';
import { V2Client } from '../../src/client/v2-client.js';
import { type Update, type VmInfo, type VmUpdate } from '../../src/client/v2-replies.js';
import { shareOf, UID_SHARE } from '../../src/budget/uid-share.js';
import { FD_RESERVE } from '../../src/budget/fd-budget.js';
import { BIN, hostArgs, startHelper } from '../daemon/support/daemon-process.js';
import { FakeQemu, FakeQemuFarm } from '../support/fake-qemu.js';
import { waitFor } from '../support/wait.js';
import { fakeHost, fdsOnto, logLines, NOBODY, notRoot, onCleanup, track } from './support.js';

/** The attack took 4,096 slots with 4,200 fakes; here the cap is CAP and the fakes are as many more, in proportion. */
const CAP = 128;
const FAKES = Math.ceil((CAP * 4200) / 4096);
/** The attack: 10 fakes of 1,000 threads against 20,000 fds; here 10 fakes of 100 threads against 2,000. */
const FD_LIMIT = 2000;
const HOG_FAKES = 10;
const HOG_THREADS = 100;
/** Connections kept free beside the VMs (the default, 4,096, would not fit in FD_LIMIT). */
const MAX_CONNECTIONS = 64;
const INTERVAL_S = 0.5;

/** A real-looking VM of root (this test's uid), spinning its vCPU so that it has energy. */
async function rootVm(name: string): Promise<FakeQemu> {
  const vm = new FakeQemu({ vcpus: 1, args: ['-name', `guest=${name}`] });
  onCleanup(() => vm.kill());
  await vm.ready();
  await vm.cmd('spin 0');
  return vm;
}

/** LIST, again every 500 ms, into `into.vms`. */
function polled(c: V2Client): { vms: VmInfo[] } {
  const into = { vms: [] as VmInfo[] };
  const t = setInterval(
    () =>
      void c.list().then(
        (l) => (into.vms = l),
        () => {},
      ),
    500,
  ); // a LIST cut by the end of the test is no result
  onCleanup(() => clearInterval(t));
  return into;
}

describe('fakes of one uid', () => {
  test('a root VM started after more fakes of uid nobody than the discovery cap is discovered and sampled; the full share is a warning naming --max-discovered-vms', async (ctx) => {
    const why = notRoot();
    if (why) return ctx.skip(why);
    const { host, sock } = fakeHost();
    onCleanup(host.pumpEnergy({ units: 2000, everyMs: 50 }));
    const daemon = track(
      await startHelper([
        '-k',
        sock,
        '-u',
        'nobody',
        '--interval',
        String(INTERVAL_S),
        '--max-discovered-vms',
        String(CAP),
        ...hostArgs(host),
      ]),
    );
    const farm = new FakeQemuFarm(FAKES, 1, { uid: NOBODY });
    onCleanup(() => farm.kill());
    const fakes = new Set(await farm.ready());

    const full = () =>
      logLines(daemon.stderr()).find(
        (l) => String(l.msg).includes('--max-discovered-vms') && fakes.has((l.vm as { pid: number } | undefined)?.pid ?? -1),
      );
    await waitFor(() => full() !== undefined, 'the warning that a fake was not tracked', daemon, 30_000);
    expect(full()).toMatchObject({ level: 'warn', vm: { uid: NOBODY }, bound: 'uid' });

    const real = await rootVm('real');
    const c = await V2Client.connect(sock);
    onCleanup(() => c.close());
    const list = polled(c);
    await waitFor(() => list.vms.some((v) => v.pid === real.pid), 'the root VM discovered', daemon, 20_000);
    const tracked = list.vms.filter((v) => fakes.has(v.pid)).length;
    expect(tracked).toBeGreaterThan(0);
    expect(tracked).toBeLessThanOrEqual(shareOf(CAP, UID_SHARE));

    const updates: VmUpdate[] = [];
    await c.observe(list.vms.find((v) => v.pid === real.pid)!.hostVmId, (u) => updates.push(u));
    await waitFor(() => (updates.at(-1)?.vpkgs[0]?.energyUj ?? 0n) > 0n, 'energy attributed to the root VM', daemon, 20_000);
  });

  test('a root VM registers and is sampled beside fakes of uid nobody whose threads would take the fds; those over its share are not sampled, with a warning', async (ctx) => {
    const why = notRoot();
    if (why) return ctx.skip(why);
    const { host, sock } = fakeHost();
    onCleanup(host.pumpEnergy({ units: 2000, everyMs: 50 }));
    const args = [
      '-k',
      sock,
      '-u',
      'nobody',
      '--interval',
      String(INTERVAL_S),
      '--max-connections',
      String(MAX_CONNECTIONS),
      ...hostArgs(host),
    ];
    const daemon = track(
      await startHelper(args, { command: ['sh', '-c', `ulimit -n ${FD_LIMIT} && exec "$0" "$@"`, process.execPath, BIN] }),
    );
    const farm = new FakeQemuFarm(HOG_FAKES, HOG_THREADS, { uid: NOBODY });
    onCleanup(() => farm.kill());
    const fakes = await farm.ready();

    const deferred = () =>
      logLines(daemon.stderr()).find(
        (l) => l.msg === 'VM discovered but not sampled' && fakes.includes((l.vm as { pid: number } | undefined)?.pid ?? -1),
      );
    await waitFor(() => deferred() !== undefined, 'a fake not sampled for want of its share', daemon, 30_000);
    expect(deferred()).toMatchObject({ level: 'warn', vm: { uid: NOBODY } });
    expect(String(deferred()!.err)).toMatch(/share/);

    const real = await rootVm('registered');
    const c = await V2Client.connect(sock);
    onCleanup(() => c.close());
    const r = await c.register({ pid: real.pid, vcpus: [{ tid: real.vcpuTids.get(0)!, vpkg: 0 }] });
    const updates: Update[] = [];
    await c.subscribe(r.vmId, (u) => updates.push(u));
    await waitFor(() => (updates.at(-1)?.vpkgs[0]?.energyUj ?? 0n) > 0n, 'energy attributed to the registered VM', daemon, 20_000);

    // Nobody's fakes keep no more than one uid's share of the VMs' fds.
    const limits = logLines(daemon.stderr()).find((l) => l.msg === 'open-file limit') as { limit: number; maxConnections: number };
    expect(limits.limit).toBe(FD_LIMIT);
    const share = shareOf(limits.limit - limits.maxConnections - FD_RESERVE, UID_SHARE);
    const kept = fakes.reduce((n, pid) => n + fdsOnto(daemon.proc.pid!, pid), 0);
    expect(kept).toBeGreaterThan(0);
    expect(kept).toBeLessThanOrEqual(share);
  });
});
