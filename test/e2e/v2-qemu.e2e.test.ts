/**
 * End to end: the real daemon (child process, fake MSR files driven by this test), two real QEMU VMs
 * registered over v2 from their QMP sockets, a legacy QEMU-style client on the same helper, and the
 * daemon's recorded trace replayed to the same totals.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { V2Client } from '../../src/client/v2-client.js';
import { type Update } from '../../src/client/v2-replies.js';
import { MSR_PKG_ENERGY_STATUS, MSR_RAPL_POWER_UNIT } from '../../src/msr/registers.js';
import { replayFile } from '../../src/trace/reader.js';
import { vmSpecFromQmp } from '../../src/client/qmp.js';
import { FakeHost } from '../support/fake-host.js';
import { missing } from '../support/env.js';
import { qemuMissing, startQemu, waitSettled } from '../support/qemu.js';
import { LegacyClient, hostArgs, spawnHelper, tempDir, waitFor } from '../daemon/support/daemon-process.js';

const cleanups: (() => Promise<unknown> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

describe('v2 end to end with QEMU', () => {
  it('spinning VM gains far more energy than an idle one; legacy and v2 clients together; the trace replays to the same totals', async (ctx) => {
    const why = missing({ root: true }) ?? qemuMissing();
    if (why) return ctx.skip(why);
    const fake = new FakeHost({ packages: [0, 0] });
    cleanups.push(() => fake.cleanup());
    // ~15 W on the fake package: 2^-14 J units, 5000 units every 20 ms.
    cleanups.push(fake.pumpEnergy({ start: 0xffff0000, units: 5000, everyMs: 20 }));

    const dir = tempDir('vmsr-e2e-');
    cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
    const sock = path.join(dir, 'helper.sock');
    const tracePath = path.join(dir, 'live.jsonl');
    // Registered VMs only: with discovery the trace would also hold every other QEMU on this machine.
    const helper = spawnHelper(['-k', sock, ...hostArgs(fake), '--interval', '0.2', '--record', tracePath, '--no-discovery']);
    cleanups.push(() => helper.stop('SIGKILL'));
    await waitFor(() => helper.stderr().includes('"msg":"Listening on'), 'the helper to listen', helper);

    // KVM where usable, else TCG. Under nested KVM a spinning vCPU's time shows up as stime, and the
    // second vCPU only starts spinning seconds into boot: wait until both guests run as their mode says.
    const busy = await startQemu({ mode: 'a', smp: 2, sockets: 2, name: 'e2e-busy' });
    cleanups.push(() => busy.stop());
    const idle = await startQemu({ mode: 'i', smp: 2, sockets: 2, name: 'e2e-idle' });
    cleanups.push(() => idle.stop());
    const settled = await Promise.all([waitSettled(busy, 'a'), waitSettled(idle, 'i')]);
    expect(settled, `guests settled (${busy.accel})`).toEqual([true, true]);
    const specBusy = await vmSpecFromQmp(busy.qmpPath, '/proc');
    const specIdle = await vmSpecFromQmp(idle.qmpPath, '/proc');
    expect(specBusy.vcpus).toHaveLength(2);

    const legacy = await LegacyClient.connect(sock);
    cleanups.push(() => legacy.close());
    expect(await legacy.request(MSR_RAPL_POWER_UNIT, 0, process.pid)).toBe(0xa0e03n);

    const c = await V2Client.connect(sock);
    cleanups.push(() => c.close());
    const rb = await c.register({ pid: specBusy.pid, vcpus: specBusy.vcpus });
    const ri = await c.register({ pid: specIdle.pid, vcpus: specIdle.vcpus });
    expect(rb.nvpkg).toBe(2);
    const ub: Update[] = [];
    const ui: Update[] = [];
    await c.subscribe(rb.vmId, (u) => ub.push(u));
    await c.subscribe(ri.vmId, (u) => ui.push(u));
    // Legacy requests interleaved with v2 traffic on the same helper.
    for (let i = 0; i < 5; i++) {
      const e = await legacy.request(MSR_PKG_ENERGY_STATUS, 0, process.pid);
      expect(e).toBeGreaterThan(0n);
      await new Promise((r) => setTimeout(r, 300));
    }
    await waitFor(() => ub.length >= 15 && ui.length >= 15, 'updates', helper, 15_000);
    // Booting costs CPU in every mode: compare growth once both guests have settled.
    await new Promise((r) => setTimeout(r, 2500));
    const fromB = ub.length - 1;
    const fromI = ui.length - 1;
    await new Promise((r) => setTimeout(r, 2500));

    const total = (u: Update) => u.vpkgs.reduce((s, v) => s + v.energyUj, 0n);
    for (const us of [ub, ui]) {
      for (let i = 1; i < us.length; i++) {
        expect(us[i]!.tNs).toBeGreaterThanOrEqual(us[i - 1]!.tNs);
        us[i]!.vpkgs.forEach((v, g) => expect(v.energyUj).toBeGreaterThanOrEqual(us[i - 1]!.vpkgs[g]!.energyUj));
      }
    }
    const gb = total(ub.at(-1)!) - total(ub[fromB]!);
    const gi = total(ui.at(-1)!) - total(ui[fromI]!);
    expect(gb).toBeGreaterThan(0n);
    expect(gb).toBeGreaterThan(5n * gi);

    // Final values and unregister in one write: no sample in between.
    const [vb0, vb1, vi0, vi1] = await Promise.all([
      c.read(rb.vmId, 0),
      c.read(rb.vmId, 1),
      c.read(ri.vmId, 0),
      c.read(ri.vmId, 1),
      c.unregister(rb.vmId),
      c.unregister(ri.vmId),
    ]);
    expect(await helper.stop('SIGTERM')).toBe(0); // the shutdown hook closes the trace

    const summary = await replayFile(tracePath);
    const [sb, si] = summary.vms.map((v) => v.output);
    expect(sb!.pid).toBe(specBusy.pid);
    expect(si!.pid).toBe(specIdle.pid);
    expect(sb!.vpkgs.map((v) => v.energyUj)).toEqual([vb0!.energyUj, vb1!.energyUj]);
    expect(si!.vpkgs.map((v) => v.energyUj)).toEqual([vi0!.energyUj, vi1!.energyUj]);
    expect(sb!.vpkgs.map((v) => BigInt(v.counter))).toEqual([vb0!.counter, vb1!.counter]);
  });
});
