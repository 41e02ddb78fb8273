/**
 * The daemon's observer surface end to end (child process, fake MSR files): HOST_UPDATE health
 * figures count legacy requests by result and connections; per package, energy balances with the
 * VMs' energy and the unattributed energy, and old clients keep the original layout; --no-discovery leaves a QEMU-like
 * process unlisted while discovery lists it; new frame types sent badly are refused like old ones.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { V2Client } from '../../src/client/v2-client.js';
import { type HostUpdate } from '../../src/client/v2-replies.js';
import { E, HELPER_TYPES, T, encodeFrame, encodeHostSubscribe } from '../../src/protocol/v2/codec.js';
import { FrameDecoder } from '../../src/protocol/v2/frame-decoder.js';
import { parseHelperFrame } from '../../src/protocol/v2/messages.js';
import { MSR_PKG_ENERGY_STATUS, MSR_RAPL_POWER_UNIT } from '../../src/msr/registers.js';
import { FakeHost } from '../support/fake-host.js';
import { FakeQemu } from '../support/fake-qemu.js';
import { LegacyClient, hostArgs, spawnHelper, tempDir, waitFor } from './support/daemon-process.js';
import { RawClient, pinnedChildMissing, startPinnedChild } from '../v2/harness.js';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function daemon(extra: string[]): Promise<{ sock: string; helper: ReturnType<typeof spawnHelper> }> {
  const fake = new FakeHost({ packages: [0, 0] });
  cleanups.push(() => fake.cleanup());
  fake.writePackageMsr(0, MSR_RAPL_POWER_UNIT, 0xa0e03n);
  fake.writePackageMsr(0, MSR_PKG_ENERGY_STATUS, 0x1000n);
  const dir = tempDir('vmsr-obs-daemon-');
  cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
  const sock = path.join(dir, 'helper.sock');
  const helper = spawnHelper(['-k', sock, ...hostArgs(fake), '--interval', '0.1', ...extra]);
  cleanups.push(() => helper.stop('SIGKILL'));
  await waitFor(() => helper.stderr().includes('"msg":"Listening on'), 'the helper to listen', helper);
  return { sock, helper };
}

/**
 * The daemon (no discovery: only the test's VMs exist) on a host of two packages, CPU 0 in package 0
 * and CPU 1 in package 1, both drawing power, with one VM bound to each CPU: so each package's
 * attributed energy is exactly the energy of the VM bound to it.
 */
async function twoPackageDaemon() {
  const fake = new FakeHost({ packages: [0, 1] });
  const stops = [fake.pumpEnergy({ pkg: 0, units: 1200, everyMs: 20 }), fake.pumpEnergy({ pkg: 1, units: 700, everyMs: 20 })];
  const stopPumps = () => stops.forEach((s) => s());
  cleanups.push(() => fake.cleanup(), stopPumps);
  const dir = tempDir('vmsr-obs-daemon-');
  cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
  const sock = path.join(dir, 'helper.sock');
  const helper = spawnHelper(['-k', sock, ...hostArgs(fake), '--interval', '0.1', '--no-discovery']);
  cleanups.push(() => helper.stop('SIGKILL'));
  await waitFor(() => helper.stderr().includes('"msg":"Listening on'), 'the helper to listen', helper);
  const vms = [startPinnedChild(0, 40), startPinnedChild(1, 20)];
  cleanups.push(...vms.map((v) => () => v.kill()));
  return { sock, helper, vms, stopPumps };
}

describe('observers on the daemon', () => {
  it('HOST_UPDATE per package: energy = energy of the VMs that ran on it + its unattributed energy, sample by sample, and nothing goes back', async (ctx) => {
    const why = pinnedChildMissing(1);
    if (why) return ctx.skip(why);
    const { sock, helper, vms } = await twoPackageDaemon();
    const c = await V2Client.connect(sock);
    cleanups.push(() => c.close());
    // vm[i] is bound to CPU i, which is package i.
    const energy = vms.map(() => new Map<bigint, bigint>());
    for (const [i, vm] of vms.entries()) {
      const r = await c.register({ pid: vm.pid, vcpus: [{ tid: vm.pid, vpkg: 0 }] });
      await c.subscribe(r.vmId, (u) => energy[i]!.set(u.tNs, u.vpkgs[0]!.energyUj));
    }
    const host: HostUpdate[] = [];
    await c.subscribeHost((u) => host.push(u));
    // Windows where both VMs published at both ends and both packages' counters moved: the test's
    // pumps are timers of this process, which a loaded machine can hold past a sample.
    const measured = () =>
      host.slice(1).filter((u1, i) => {
        const u0 = host[i]!;
        const published = energy.every((m) => m.has(u0.tNs) && m.has(u1.tNs));
        return published && u1.packages.every((p, k) => p.energyUj > u0.packages[k]!.energyUj);
      }).length;
    await waitFor(() => host.length >= 15 && measured() >= 8, '8 sample windows in which both packages moved', helper, 60_000);

    let checked = 0;
    for (let i = 0; i + 1 < host.length; i++) {
      const [u0, u1] = [host[i]!, host[i + 1]!];
      expect(u1.packages.map((p) => p.pkg)).toEqual([0, 1]);
      for (const [k, p1] of u1.packages.entries()) {
        const p0 = u0.packages[k]!;
        // Cumulative values never go back.
        expect(p1.energyUj).toBeGreaterThanOrEqual(p0.energyUj);
        expect(p1.unattributedUj!).toBeGreaterThanOrEqual(p0.unattributedUj!);
        expect(p1.unattributedUj!).toBeLessThanOrEqual(p1.energyUj);
      }
      expect(u1.unattributedUj).toBeGreaterThanOrEqual(u0.unattributedUj);
      // The host-wide figure is the packages' sum (each value floored to a µJ on its own).
      const perPackage = u1.packages.reduce((a, p) => a + p.unattributedUj!, 0n);
      expect(Number(u1.unattributedUj - perPackage)).toBeGreaterThanOrEqual(0);
      expect(Number(u1.unattributedUj - perPackage)).toBeLessThanOrEqual(1);
      // Windows where both VMs published at both ends (not a baseline sample).
      if (!energy.every((m) => m.has(u0.tNs) && m.has(u1.tNs))) continue;
      for (const pkg of [0, 1]) {
        const vmDelta = Number(energy[pkg]!.get(u1.tNs)! - energy[pkg]!.get(u0.tNs)!);
        const pkgDelta = Number(u1.packages[pkg]!.energyUj - u0.packages[pkg]!.energyUj);
        const unDelta = Number(u1.packages[pkg]!.unattributedUj! - u0.packages[pkg]!.unattributedUj!);
        expect(pkgDelta).toBeGreaterThanOrEqual(0);
        // floor() to whole µJ on three sides: at most a few µJ apart.
        expect(Math.abs(pkgDelta - vmDelta - unDelta), `package ${pkg}: ${pkgDelta} = ${vmDelta} + ${unDelta}?`).toBeLessThanOrEqual(3);
      }
      checked++;
    }
    expect(checked).toBeGreaterThanOrEqual(measured());
    // Both VMs got energy on their own package, and neither package was all theirs.
    const last = host.at(-1)!;
    for (const pkg of [0, 1]) {
      const vmTotal = [...energy[pkg]!.values()].reduce((a, b) => (b > a ? b : a), 0n);
      expect(vmTotal).toBeGreaterThan(0n);
      expect(last.packages[pkg]!.unattributedUj!).toBeGreaterThan(0n);
    }
  });

  it('a client that does not ask for per-package unattributed energy gets the original HOST_UPDATE layout', async () => {
    const { sock } = await daemon(['--no-discovery']);
    const raw = await RawClient.connect(sock);
    cleanups.push(() => raw.destroy());
    raw.write(encodeHostSubscribe({ perPackage: false }));
    // 8-byte header + 80 + one 16-byte package entry; then one such frame per sample.
    await raw.waitBytes(3 * (8 + 80 + 16));
    // Flag bits other than bits 0 and 1 are refused with ERROR 1, and the connection stays.
    raw.write(encodeFrame(T.HOST_SUBSCRIBE, 0x4, Buffer.alloc(0)));
    const frames = () =>
      new FrameDecoder(HELPER_TYPES).push(raw.received).map((f) => {
        if (!f.ok) throw new Error(f.error.message);
        return f.value;
      });
    await waitFor(() => frames().some((f) => f.type === T.ERROR), 'the ERROR answering flags 0x4');
    const all = frames();
    const updates = all.filter((f) => f.type === T.HOST_UPDATE);
    expect(updates.length).toBeGreaterThanOrEqual(3);
    for (const f of updates) {
      expect(f.flags & 0x2).toBe(0);
      expect(f.payload.length).toBe(80 + 16);
      expect(parseHelperFrame(f)).toMatchObject({ ok: true, value: { packages: [{ pkg: 0, unattributedUj: null }] } });
    }
    expect(parseHelperFrame(all.find((f) => f.type === T.ERROR)!)).toMatchObject({
      ok: true,
      value: { code: E.MALFORMED, requestType: T.HOST_SUBSCRIBE },
    });
    expect(raw.socket.destroyed).toBe(false);
  });

  it('HOST_UPDATE counts legacy requests by result, connections and samples', async () => {
    const { sock, helper } = await daemon([]);
    const c = await V2Client.connect(sock);
    cleanups.push(() => c.close());
    const legacy = await LegacyClient.connect(sock);
    cleanups.push(() => legacy.close());
    expect(await legacy.request(MSR_RAPL_POWER_UNIT, 0, process.pid)).toBe(0xa0e03n);
    expect(await legacy.request(MSR_RAPL_POWER_UNIT, 0, 1)).toBe(0n); // tid 1 is not ours: refused, 0
    let last: HostUpdate | undefined;
    await c.subscribeHost((u) => (last = u));
    await waitFor(() => last !== undefined && last.stats.samples > 2n, 'host updates', helper);
    expect(last!.stats).toMatchObject({ legacyOk: 1n, legacyRefused: 1n, legacyFailed: 0n });
    expect(last!.stats.connections).toBeGreaterThanOrEqual(2);
    expect(last!.stats.lastSampleDurationNs).toBeGreaterThan(0n);
    expect(last!.packages.map((p) => p.pkg)).toEqual([0]);
  });

  it('lists a QEMU-like process with discovery on, and not with --no-discovery', async () => {
    const q = await new FakeQemu({ vcpus: 1, args: ['-name', 'seen-or-not'] }).ready();
    cleanups.push(() => q.kill());
    const on = await daemon([]);
    const off = await daemon(['--no-discovery']);
    const con = await V2Client.connect(on.sock);
    const coff = await V2Client.connect(off.sock);
    cleanups.push(
      () => con.close(),
      () => coff.close(),
    );
    await waitFor(() => on.helper.stderr().includes('"msg":"VM discovered"'), 'a discovery log line', on.helper);
    let listed = false;
    for (let i = 0; i < 50 && !listed; i++) {
      listed = (await con.list()).some((v) => v.pid === q.pid && v.name === 'seen-or-not');
      if (!listed) await new Promise((r) => setTimeout(r, 100));
    }
    expect(listed).toBe(true);
    await new Promise((r) => setTimeout(r, 500));
    expect((await coff.list()).some((v) => v.pid === q.pid)).toBe(false);
  });

  it('a LIST with a wrong payload size gets ERROR 1 and the connection is closed; OBSERVE of an unknown id gets ERROR 3 and it stays', async () => {
    const { sock } = await daemon(['--no-discovery']);
    const c = await V2Client.connect(sock);
    cleanups.push(() => c.close());
    await expect(c.observe(424242, () => {})).rejects.toMatchObject({ code: E.NO_SUCH, requestType: T.OBSERVE });
    await c.unobserve(424242);
    expect(await c.list()).toEqual([]);
    c.writeRaw(encodeFrame(T.LIST, 0, Buffer.alloc(5)));
    const why = await c.closed;
    expect(why).toMatchObject({ code: E.MALFORMED, requestType: T.LIST });
  });
});
