/**
 * STATS_FD against the real v2 service on a real Unix socket (the daemon's assembly over the fake MSR
 * files, the real /proc, real child processes): the fd comes in SCM_RIGHTS, it is read-only and
 * sealed, its values grow each interval and equal READ's for the same sample, a hammering reader never
 * sees a torn sample, the fd outlives the connection and the VM.
 */
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { spawn } from 'node:child_process';
import { afterEach, describe, expect, it } from 'vitest';
import { V2Client } from '../../src/client/v2-client.js';
import { V2Error } from '../../src/client/v2-replies.js';
import { StatsReader } from '../../src/client/stats-reader.js';
import { E } from '../../src/protocol/v2/codec.js';
import { closeFd } from '../../src/os/libc/fds.js';
import { F_SEAL_FUTURE_WRITE, F_SEAL_GROW, F_SEAL_SHRINK, getSeals } from '../../src/os/libc/memfd-mmap.js';
import type { FdAdmitter } from '../../src/helper/v2/vm-registry.js';
import { FdBudget } from '../../src/budget/fd-budget.js';
import { seenByNewClient, startChild, startHarness, threadsOf, until, type Harness, type TestChild } from '../v2/harness.js';

const cleanups: (() => unknown)[] = [];
/** A spinning child gets a tick only now and then on a loaded 2-core host: waits for its energy allow this long. */
const LOADED_HOST_MS = 15_000;

/**
 * Adds energy every 20 ms until the test ends: a sample in which the VM's thread did not run gives
 * the VM none of that sample's energy, so one addition may never reach it on a loaded host.
 */
function keepAddingEnergy(h: Harness): void {
  const t = setInterval(() => h.addEnergy(10_000), 20);
  cleanups.push(() => clearInterval(t));
}
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function setup(
  o: { intervalMs?: number; fds?: FdAdmitter } = {},
): Promise<{ h: Harness; c: V2Client; child: TestChild; vmId: number }> {
  const h = await startHarness({ intervalMs: o.intervalMs ?? 50, ...(o.fds ? { fds: o.fds } : {}) });
  cleanups.push(() => h.close());
  const child = startChild('spin');
  cleanups.push(() => child.kill());
  await until(() => fs.existsSync(`/proc/${child.pid}/task`));
  const c = await V2Client.connect(h.socketPath);
  cleanups.push(() => c.close());
  const tids = threadsOf(child.pid);
  const r = await c.register({ pid: child.pid, vcpus: [{ tid: tids[0]!, vpkg: 0 }] });
  return { h, c, child, vmId: r.vmId };
}

describe('STATS_FD on the v2 service', () => {
  it('hands a sealed read-only fd whose descriptors parse and whose values grow each interval', async () => {
    const { h, c, vmId } = await setup();
    const { fd, fileSize } = await c.statsFd(vmId);
    const r = StatsReader.open(fd);
    cleanups.push(() => r.close());
    expect(r.layout.fileSize).toBe(fileSize);
    expect(r.layout.id).toMatch(new RegExp(`^vmsr-vm-${vmId}/pid-`));
    expect(r.layout.descriptors.map((d) => d.name)).toEqual(
      expect.arrayContaining(['generation', 'energy', 'msr_energy_status', 'power', 'vcpu_energy', 'vcpu_cpu_time', 'ended']),
    );
    const seals = getSeals(fd);
    expect(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE)).toBe(F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE);
    expect(() => fs.writeSync(fd, Buffer.from('x'), 0, 1, 0)).toThrow(/EBADF|EPERM/);
    expect(() => fs.ftruncateSync(fd, 0)).toThrow(/EINVAL|EPERM|EBADF/);
    // A reopen for writing through /proc/self/fd gets nowhere either.
    const rw = (() => {
      try {
        return fs.openSync(`/proc/self/fd/${fd}`, 'r+');
      } catch {
        return null;
      }
    })();
    if (rw !== null) {
      expect(() => fs.writeSync(rw, Buffer.from('x'), 0, 1, 0)).toThrow(/EPERM/);
      fs.closeSync(rw);
    }
    // Each round waits for a sample that gives the VM more: the generation moves on every sample, the
    // VM's energy when its thread ran in one (on a loaded host, not every 50 ms).
    keepAddingEnergy(h);
    let last = -1n;
    for (let i = 0; i < 3; i++) {
      const g0 = r.value(r.read(), 'generation')!;
      await until(
        () => r.value(r.read(), 'generation')! > g0 && r.value(r.read(), 'energy')! > last,
        LOADED_HOST_MS,
        'the VM given energy',
      );
      last = r.value(r.read(), 'energy')!;
    }
    expect(last).toBeGreaterThan(0n);
  });

  it('holds what READ says for the same sample', async () => {
    const { h, c, vmId } = await setup({ intervalMs: 200 });
    const r = StatsReader.open((await c.statsFd(vmId)).fd);
    cleanups.push(() => r.close());
    keepAddingEnergy(h);
    await until(() => r.value(r.read(), 'energy')! > 0n, LOADED_HOST_MS, 'the VM given energy');
    for (let i = 0; i < 5; i++) {
      const s1 = r.read();
      const v = await c.read(vmId, 0);
      const s2 = r.read();
      if (r.value(s1, 'sample_monotonic') !== r.value(s2, 'sample_monotonic') || r.value(s2, 'sample_monotonic') !== v.tNs) continue;
      expect(r.value(s2, 'energy')).toBe(v.energyUj);
      expect(r.value(s2, 'msr_energy_status')).toBe(v.counter);
      expect(r.value(s2, 'sample_realtime')! > 0n).toBe(true);
      return;
    }
    throw new Error('no READ fell between two reads of one sample');
  });

  it('a reader in another process hammering reads (mapped and pread) during updates never sees a torn sample', async () => {
    const { h, c, vmId } = await setup({ intervalMs: 10 });
    const { fd } = await c.statsFd(vmId);
    cleanups.push(() => closeFd(fd));
    // The reader runs in its own process (the daemon's writes are not in its event loop), on fd 3.
    const reader = pathToFileURL(path.resolve('dist/src/client/stats-reader.js')).href;
    const body = `
      const { StatsReader } = await import(${JSON.stringify(reader)});
      const r = StatsReader.open(3);
      let reads = 0, torn = 0; const gens = new Set();
      const end = Date.now() + 1500;
      while (Date.now() < end) {
        const s = reads % 2 ? r.read() : r.readByPread(); reads++; gens.add(s.generation);
        const inBlock = s.data.readBigUInt64LE(0);
        const e = r.value(s, 'energy'), v = r.values(s, 'vcpu_energy')[0];
        // One vCPU: its energy is the VM's (each floored on its own: 1 µJ apart at most) in one whole sample.
        if (inBlock !== s.generation || (e > v ? e - v : v - e) > 1n) torn++;
      }
      process.stdout.write(JSON.stringify({ reads, torn, gens: gens.size }));`;
    const child = spawn(process.execPath, ['--input-type=module', '-e', body], { stdio: ['ignore', 'pipe', 'inherit', fd] });
    let out = '';
    child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    const pump = setInterval(() => h.addEnergy(3000), 2);
    await new Promise((res) => child.once('exit', res));
    clearInterval(pump);
    const got = JSON.parse(out) as { reads: number; torn: number; gens: number };
    expect(got.torn).toBe(0);
    expect(got.reads).toBeGreaterThan(10_000);
    expect(got.gens).toBeGreaterThan(20);
  });

  it('the fd outlives the connection and the VM, and then says the VM ended with its final values', async () => {
    const { h, c, child, vmId } = await setup();
    const { fd } = await c.statsFd(vmId);
    const r = StatsReader.open(fd);
    cleanups.push(() => r.close());
    keepAddingEnergy(h);
    await until(() => r.value(r.read(), 'energy')! > 0n, LOADED_HOST_MS, 'the VM given energy');
    await c.close();
    await child.kill();
    await until(
      () => r.value(r.read(), 'ended') === 1n || r.value(r.read(), 'replaced') === 1n,
      LOADED_HOST_MS,
      'the file says the VM ended',
    );
    const final = r.read();
    expect(r.value(final, 'next_sample_monotonic')).toBe(0n);
    const e = r.value(final, 'energy')!;
    await new Promise((res) => setTimeout(res, 200));
    expect(r.value(r.read(), 'energy')).toBe(e);
    expect((await seenByNewClient(h.socketPath)).vms).toBe(0);
  });

  it('answers ERROR 3 for an id that does not exist and keeps the connection', async () => {
    const { c } = await setup();
    await expect(c.statsFd(999)).rejects.toMatchObject({ code: E.NO_SUCH });
    await expect(c.statsFd(999)).rejects.toBeInstanceOf(V2Error);
    const { fd } = await c.statsFd(0);
    const host = StatsReader.open(fd);
    cleanups.push(() => host.close());
    expect(host.layout.id).toMatch(/^vmsr-host\//);
    expect(host.values(host.read(), 'package_energy')!.length).toBe(1);
  });

  it('answers ERROR 4 naming the fix when the fd budget has no room for the file, and serves again once it has', async () => {
    let room = 0;
    const budget = new FdBudget({ limit: 1_000_000, maxConnections: 1, openConnections: () => 1, openFds: () => 1_000_000 - 32 - room });
    const { c, vmId } = await setup({
      fds: { canAdmit: () => ({ ok: true, value: undefined }), canOpen: (n, what) => budget.canOpen(n, what) },
    });
    const err = await c.statsFd(vmId).catch((e: V2Error) => e);
    expect(err).toBeInstanceOf(V2Error);
    expect((err as V2Error).code).toBe(E.LIMIT);
    expect((err as V2Error).message).toMatch(/not enough file descriptors.*raise the helper's open-file limit/);
    room = 2;
    const r = StatsReader.open((await c.statsFd(vmId)).fd);
    r.close();
  });
});
