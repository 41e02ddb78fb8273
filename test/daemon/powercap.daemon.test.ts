/**
 * The daemon on a host without MSR devices but with the kernel's powercap zones (a fake tree in the
 * kernel's layout): --energy-source auto chooses powercap, the zones' energy_uj fds opened by the
 * root image cross the re-exec, host energy follows the zones, and QEMU's legacy requests get the
 * protocol's failure reply (0) with a warning saying why.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { V2Client } from '../../src/client/v2-client.js';
import { type HostUpdate } from '../../src/client/v2-replies.js';
import { MSR_PKG_ENERGY_STATUS } from '../../src/msr/registers.js';
import { FakeHost } from '../support/fake-host.js';
import { LegacyClient, startHelper, tempDir, waitFor, type DaemonChild } from './support/daemon-process.js';

describe('daemon on powercap (no MSR device)', () => {
  let host: FakeHost;
  let dir: string;
  let sock: string;
  let helper: DaemonChild;
  let pump: NodeJS.Timeout;

  beforeAll(async () => {
    host = new FakeHost({ packages: [0, 0, 1, 1] });
    const max = 262143328850n;
    host.writePowercap([
      { id: '0', name: 'package-0', max, uj: max - 50_000n }, // wraps within the first samples
      { id: '0:0', name: 'dram', max, uj: 1n },
      { id: '1', name: 'package-1', max, uj: 7n },
    ]);
    // 1 mJ per 10 ms on package 0, 2 mJ on package 1
    pump = setInterval(() => {
      host.addZoneEnergy('0', 1000n);
      host.addZoneEnergy('1', 2000n);
    }, 10);
    dir = tempDir();
    sock = path.join(dir, 'helper.sock');
    // --msr-path names no file: auto finds no MSR device and takes the powercap zones
    helper = await startHelper([
      '-k',
      sock,
      '--msr-path',
      path.join(dir, 'none/%u/msr'),
      '--sys-root',
      host.sysRoot,
      '--vendor',
      'intel',
      '--interval',
      '0.05',
    ]);
  });

  afterAll(async () => {
    clearInterval(pump);
    await helper?.stop();
    host?.cleanup();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  test('auto chooses powercap, says why, and names the zones it reads', () => {
    const log = helper.stderr();
    expect(log).toMatch(/"why":"auto: no MSR device \([^)]*none\/0\/msr: ENOENT\), the powercap zones open"/);
    expect(log).toContain('powercap zones open (no MSR device: legacy requests get 0)');
    expect(log).toMatch(/energy counters read from powercap \([^)]*\): package \(intel-rapl:0, intel-rapl:1\), dram \(intel-rapl:0:0\)/);
  });

  test('host energy per package follows the zones, across package 0 wrap', async () => {
    const c = await V2Client.connect(sock);
    const updates: HostUpdate[] = [];
    await c.subscribeHost((u) => updates.push(u));
    await waitFor(() => updates.length >= 12, '12 host updates', helper);
    await c.close();
    const [a, b] = [updates[1]!, updates.at(-1)!];
    const grew = (k: number) => Number(b.packages[k]!.energyUj - a.packages[k]!.energyUj);
    expect(b.packages.map((p) => p.pkg)).toEqual([0, 1]);
    // package 1 gets twice package 0's energy; both grow at the pump's pace (no wrap lost, none counted twice)
    expect(grew(0)).toBeGreaterThan(0);
    expect(grew(1) / grew(0)).toBeGreaterThan(1.6);
    expect(grew(1) / grew(0)).toBeLessThan(2.4);
    const s = Number(b.tNs - a.tNs) / 1e9;
    expect(grew(0) / s).toBeGreaterThan(30_000); // 100 000 µJ/s pumped, give or take timer slack
    expect(grew(0) / s).toBeLessThan(150_000);
  });

  test("QEMU's legacy request gets 0, counted as failed, with a warning naming the energy source", async () => {
    const legacy = await LegacyClient.connect(sock);
    expect(await legacy.request(MSR_PKG_ENERGY_STATUS, 0, process.pid)).toBe(0n);
    legacy.close();
    await waitFor(
      () => helper.stderr().includes('QEMU asked for an MSR, but the daemon reads energy from powercap'),
      'the warning',
      helper,
    );
    const c = await V2Client.connect(sock);
    let last: HostUpdate | undefined;
    await c.subscribeHost((u) => (last = u));
    await waitFor(() => last !== undefined && last.stats.legacyFailed === 1n, 'the failed count', helper);
    await c.close();
    expect(last!.stats).toMatchObject({ legacyOk: 0n, legacyFailed: 1n });
  });
});
