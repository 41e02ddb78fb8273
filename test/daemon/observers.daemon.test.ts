/**
 * The daemon's observer surface end to end (child process, fake MSR files): HOST_UPDATE health
 * figures count legacy requests by result and connections; --no-discovery leaves a QEMU-like
 * process unlisted while discovery lists it; new frame types sent badly are refused like old ones.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { V2Client, type HostUpdate } from '../../src/client/v2-client.js';
import { E, T, encodeFrame } from '../../src/protocol/v2/codec.js';
import { MSR_PKG_ENERGY_STATUS, MSR_RAPL_POWER_UNIT } from '../../src/msr/registers.js';
import { FakeHost } from '../support/fake-host.js';
import { FakeQemu } from '../support/fake-qemu.js';
import { LegacyClient, hostArgs, spawnHelper, tempDir, waitFor } from './support/daemon-process.js';

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

describe('observers on the daemon', () => {
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
    cleanups.push(() => con.close(), () => coff.close());
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
