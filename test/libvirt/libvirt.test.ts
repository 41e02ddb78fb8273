/**
 * libvirt end to end: the real daemon (child process, discovery on, fake MSR files driven by this
 * test) finds libvirt's QEMU processes (running as libvirt-qemu, started by libvirtd) with their
 * names and UUIDs, and splits energy per virtual package as the guests load their vCPUs.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { V2Client } from '../../src/client/v2-client.js';
import { type VmInfo, type VmUpdate } from '../../src/client/v2-replies.js';
import { FakeHost } from '../support/fake-host.js';
import { createDomain, ensureLibvirtd, guestKernelDir, libvirtMissing, type Domain } from '../support/libvirt.js';
import { waitSettled, type QemuGuest } from '../support/qemu.js';
import { hostArgs, spawnHelper, tempDir, waitFor, type DaemonChild } from '../daemon/support/daemon-process.js';

const why = libvirtMissing();
if (why) console.log(`skipping the libvirt test: ${why}`);

const delta = (a: VmUpdate, b: VmUpdate, g: number) => Number(b.vpkgs[g]!.energyUj - a.vpkgs[g]!.energyUj);

describe.skipIf(why !== null)('libvirt domains discovered by the daemon', () => {
  const cleanups: (() => unknown)[] = [];
  let helper: DaemonChild;
  let sock: string;
  const domains: Domain[] = [];

  beforeAll(async () => {
    await ensureLibvirtd();
    const fake = new FakeHost({ packages: [0, 0] });
    cleanups.push(() => fake.cleanup());
    cleanups.push(fake.pumpEnergy({ start: 0xfff00000, units: 5000, everyMs: 20 }));
    const dir = tempDir('vmsr-libvirt-test-');
    cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
    sock = path.join(dir, 'helper.sock');
    helper = spawnHelper(['-k', sock, ...hostArgs(fake), '--interval', '0.2']);
    cleanups.push(() => helper.stop('SIGKILL'));
    await waitFor(() => helper.stderr().includes('"msg":"Listening on'), 'the helper to listen', helper);
    const k = guestKernelDir();
    cleanups.push(() => k.remove());
    const tag = `vmsr8-${process.pid}`;
    // Busy: the boot vCPU (vCPU 0, socket 0) spins; idle: every vCPU halts. Two sockets each.
    domains.push(createDomain({ name: `${tag}-busy`, kernel: k.kernel, dir: k.dir, mode: 'b', vcpus: 2, sockets: 2 }));
    domains.push(createDomain({ name: `${tag}-idle`, kernel: k.kernel, dir: k.dir, mode: 'i', vcpus: 2, sockets: 2 }));
  }, 120_000);

  afterAll(async () => {
    for (const d of domains) d.destroy();
    for (const c of cleanups.reverse()) await c();
  }, 120_000);

  it("finds every domain with its name, UUID and two virtual packages; the busy one gains far more, in the busy vCPU's package", async () => {
    const [busy, idle] = domains as [Domain, Domain];
    const c = await V2Client.connect(sock);
    cleanups.push(() => c.close());
    let vms: VmInfo[] = [];
    const deadline = Date.now() + 20_000;
    for (;;) {
      vms = (await c.list()).filter((v) => v.pid === busy.pid || v.pid === idle.pid);
      if (vms.length === 2 && vms.every((v) => !v.wholeVmOnly)) break;
      if (Date.now() > deadline)
        throw new Error(`domains not discovered with their vCPU threads in 20 s: ${JSON.stringify(vms)}\n${helper.stderr()}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    const libvirtQemuUid = fs.statSync(`/proc/${busy.pid}`).uid;
    for (const d of [busy, idle]) {
      expect(vms.find((v) => v.pid === d.pid)).toMatchObject({
        name: d.name,
        uuid: d.uuid,
        source: 'discovered',
        nvpkg: 2,
        uid: libvirtQemuUid,
        ended: false,
      });
    }
    expect(libvirtQemuUid).not.toBe(0);
    const asGuest = (d: Domain) => ({ pid: d.pid }) as QemuGuest;
    expect(
      await Promise.all([waitSettled(asGuest(busy), 'b', { timeoutMs: 60_000 }), waitSettled(asGuest(idle), 'i', { timeoutMs: 60_000 })]),
    ).toEqual([true, true]);

    const ub: VmUpdate[] = [];
    const ui: VmUpdate[] = [];
    await c.observe(vms.find((v) => v.pid === busy.pid)!.hostVmId, (u) => ub.push(u));
    await c.observe(vms.find((v) => v.pid === idle.pid)!.hostVmId, (u) => ui.push(u));
    await waitFor(() => ub.length >= 12 && ui.length >= 12, '12 updates of each', helper, 20_000);
    const [b0, b1, i0, i1] = [
      delta(ub[1]!, ub.at(-1)!, 0),
      delta(ub[1]!, ub.at(-1)!, 1),
      delta(ui[1]!, ui.at(-1)!, 0),
      delta(ui[1]!, ui.at(-1)!, 1),
    ];
    expect(b0 + b1).toBeGreaterThan(5 * (i0 + i1 + 1));
    // mode b: vCPU 0 (socket 0) spins, vCPU 1 (socket 1) halts.
    expect(b0).toBeGreaterThan(5 * (b1 + 1));
  }, 180_000);

  it('a domain that is destroyed ends for its observers', async () => {
    const idle = domains[1]!;
    const c = await V2Client.connect(sock);
    cleanups.push(() => c.close());
    const vm = (await c.list()).find((v) => v.pid === idle.pid)!;
    let ended = false;
    await c.observe(vm.hostVmId, (u) => (ended ||= u.ended));
    idle.destroy();
    await waitFor(() => ended, 'the ended update', helper, 20_000);
  }, 60_000);
});
