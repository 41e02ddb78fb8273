/**
 * The resuming v2 client against the real daemon restarted in place (SIGHUP, docs/daemon.md
 * "Restarts"): the same ids, one stream of updates that never goes backwards, in the layout each
 * subscription asked for (with or without the other RAPL domains), and a give-up that
 * names the fix when the helper does not come back.
 */
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { ResumingV2Client } from '../../src/client/resuming-client.js';
import type { HostUpdate, Update, VmUpdate } from '../../src/client/v2-replies.js';
import { E } from '../../src/protocol/v2/codec.js';
import { EnergyPump } from '../support/energy-pump.js';
import { FakeHost } from '../support/fake-host.js';
import { ThreadedProcess } from '../support/threads.js';
import { hostArgs, startHelper, tempDir, waitFor, type DaemonChild } from '../daemon/support/daemon-process.js';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function setup(): Promise<{ helper: DaemonChild; sock: string; vm: ThreadedProcess }> {
  const host = new FakeHost({ packages: [0, 0], online: [0, 1] });
  host.writePackageMsr(0, 0x606, 0xa1003n);
  const pump = new EnergyPump(host, { msr: 0x611, start: 0x1000, unitsPerSecond: 50_000 });
  pump.start();
  const sock = path.join(tempDir(), 'helper.sock');
  const helper = await startHelper(['-k', sock, ...hostArgs(host), '--interval', '0.1', '--no-discovery']);
  const vm = new ThreadedProcess();
  await vm.ready();
  await vm.cmd('start 2');
  cleanups.push(
    () => host.cleanup(),
    () => pump.stop(),
    () => helper.stop('SIGKILL'),
    () => vm.kill(),
  );
  return { helper, sock, vm };
}

const restarts = (h: DaemonChild) => h.stderr().split('"msg":"handed over:').length - 1;

describe('ResumingV2Client', () => {
  test('resumes its registration, subscription, observation and host subscription with the same ids when the helper restarts in place', async () => {
    const { helper, sock, vm } = await setup();
    const resumed: { reason: Error | null; awayMs: number }[] = [];
    const c = await ResumingV2Client.connect(sock, { onResumed: (r) => resumed.push(r) });
    cleanups.push(() => c.close());
    const [, t1, t2] = vm.tids();
    const reg = await c.register({
      pid: vm.pid,
      vcpus: [
        { tid: t1!, vpkg: 0 },
        { tid: t2!, vpkg: 1 },
      ],
    });
    const updates: Update[] = [];
    const observed: VmUpdate[] = [];
    const hosts: HostUpdate[] = [];
    const errors: Error[] = [];
    await c.subscribe(
      reg.vmId,
      (u) => updates.push(u),
      (e) => errors.push(e),
    );
    // An observer on a connection of its own: a connection's UPDATEs name a registration's vm_id or
    // an observed host VM id, which may be the same number.
    const o = await ResumingV2Client.connect(sock, { onResumed: (r) => resumed.push(r) });
    cleanups.push(() => o.close());
    const [vmInfo] = (await o.list()).filter((v) => v.pid === vm.pid);
    // The observer asks for the other RAPL domains (none on this host: an empty list), and asks again after each restart.
    await o.observe(
      vmInfo!.hostVmId,
      (u) => observed.push(u),
      (e) => errors.push(e),
      { domains: true },
    );
    await o.subscribeHost((u) => hosts.push(u), undefined, { domains: true });
    await waitFor(() => updates.length > 3, 'updates before the restart');

    for (let i = 1; i <= 2; i++) {
      helper.proc.kill('SIGHUP');
      await waitFor(() => restarts(helper) >= i, `restart ${i} (its binary check may take 30 s on a busy host)`, helper, 60_000);
      await waitFor(() => resumed.length >= 2 * i, `both clients to resume after restart ${i}`, undefined, 20_000);
    }
    const before = { updates: updates.length, observed: observed.length, hosts: hosts.length };
    await waitFor(
      () => updates.length > before.updates + 3 && observed.length > before.observed + 3 && hosts.length > before.hosts + 3,
      'updates after the restarts',
      undefined,
      10_000,
    );
    expect(resumed.every((r) => r.reason instanceof Error && (r.reason as { code?: number }).code === E.RESTARTING)).toBe(true);
    expect(errors).toEqual([]);
    // The same ids: the helper kept the registration and the host VM id.
    expect(new Set(updates.map((u) => u.vmId))).toEqual(new Set([reg.vmId]));
    expect(new Set(observed.map((u) => u.hostVmId))).toEqual(new Set([vmInfo!.hostVmId]));
    expect((await o.list()).filter((v) => v.pid === vm.pid).map((v) => v.hostVmId)).toEqual([vmInfo!.hostVmId]);
    // One stream that never goes backwards, across both restarts.
    for (const series of [updates.map((u) => u.vpkgs), observed.map((u) => u.vpkgs)]) {
      for (let i = 1; i < series.length; i++)
        for (let g = 0; g < 2; g++) expect(series[i]![g]!.energyUj).toBeGreaterThanOrEqual(series[i - 1]![g]!.energyUj);
    }
    for (let i = 1; i < hosts.length; i++)
      expect(hosts[i]!.packages[0]!.energyUj).toBeGreaterThanOrEqual(hosts[i - 1]!.packages[0]!.energyUj);
    // Each subscription keeps the layout it asked for: domains for the observer, none for the registrant.
    expect(observed.every((u) => Array.isArray(u.domains) && u.domains.length === 0)).toBe(true);
    expect(hosts.every((u) => Array.isArray(u.domains) && u.domains.length === 0)).toBe(true);
    expect(updates.every((u) => u.domains === undefined)).toBe(true);
    // Requests go to the new connection.
    expect((await (await c.ready()).read(reg.vmId, 0)).vmId).toBe(reg.vmId);
  }, 240_000); // two restarts, each waited for up to 60 s on a busy host

  test('gives up, naming the fix, when the helper does not come back within resumeForMs', async () => {
    const { helper, sock } = await setup();
    const c = await ResumingV2Client.connect(sock, { resumeForMs: 500 });
    cleanups.push(() => c.close());
    await c.subscribeHost(() => {});
    await helper.stop('SIGKILL');
    const why = await c.closed;
    expect(why?.message).toMatch(
      /cannot resume the connection to the helper at .*: it did not come back within 1 s .*check that the helper runs/,
    );
    await expect(c.list()).rejects.toThrow(/did not come back/);
  });
});
