/**
 * A trace recorded with `--record` across restarts in place (docs/daemon.md "Restarts", docs/recording.md):
 * each new image goes on with the same file (same gzip stream, no new header) from the state the old
 * one handed over, so `vmsr-helper replay` of the file must give each VM the totals the daemon itself
 * reported at the end. Real parts: the built daemon restarted by SIGHUP and `vmsr-helper reload`, two
 * real processes whose threads burn CPU registered as VMs by the resuming v2 client (which registers
 * them again after each restart, getting the same vm_id back), the real `vmsr-helper replay --json`.
 * The one fake is the package counter (FakeHost, driven by an EnergyPump).
 *
 * Rounding: the daemon and the replay run the same ratio engine over the same samples; each VM's
 * total is kept in joules (float64, carried bit for bit in the restart state) and reported as the
 * floor of its µJ. Replay adds the same terms in the same order, so the totals should be equal; the
 * test allows 1 µJ per virtual package (a float sum taken in another order can floor one µJ lower)
 * and prints the largest difference it saw.
 */
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterEach, describe, expect, test } from 'vitest';
import { ResumingV2Client } from '../../src/client/resuming-client.js';
import { MSR_PKG_ENERGY_STATUS, MSR_RAPL_POWER_UNIT } from '../../src/msr/registers.js';
import { BIN, hostArgs, startHelper, tempDir, waitFor } from '../daemon/support/daemon-process.js';
import { EnergyPump } from '../support/energy-pump.js';
import { FakeHost } from '../support/fake-host.js';
import { ThreadedProcess } from '../support/threads.js';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const RESTARTS = 5;
/** µJ a replayed total may differ from the live one, per virtual package (see the header). */
const ROUNDING_UJ = 1n;
const run = promisify(execFile);

/** A process with a burner thread (vCPU 0) and a sleeping one (vCPU 1); `burnEveryMs` paces the burns. */
async function burningVm(burnEveryMs: number): Promise<{ vm: ThreadedProcess; vcpus: { tid: number; vpkg: number }[] }> {
  const vm = new ThreadedProcess();
  cleanups.push(() => vm.kill());
  await vm.ready();
  const before = new Set(vm.tids());
  await vm.cmd('burner');
  const burner = vm.tids().find((t) => !before.has(t))!;
  const before2 = new Set(vm.tids());
  await vm.cmd('start 1');
  const sleeper = vm.tids().find((t) => !before2.has(t))!;
  let on = true;
  cleanups.push(() => (on = false));
  void (async () => {
    while (on) {
      await vm.cmd('burn').catch(() => (on = false));
      await new Promise((r) => setTimeout(r, burnEveryMs));
    }
  })();
  return {
    vm,
    vcpus: [
      { tid: burner, vpkg: 0 },
      { tid: sleeper, vpkg: 1 },
    ],
  };
}

interface ReplayTotal {
  type: 'total';
  vms: { pid: number; vpkgs: { vpkg: number; energy_uj: string }[] }[];
}

describe('--record across restarts in place', () => {
  test('the trace replays to the per-VM totals the daemon reported, when it was recorded across 5 restarts in place (SIGHUP and vmsr-helper reload)', async () => {
    const host = new FakeHost({ packages: [0, 0], online: [0, 1] });
    cleanups.push(() => host.cleanup());
    host.writePackageMsr(0, MSR_RAPL_POWER_UNIT, 0xa0e03n);
    const pump = new EnergyPump(host, { msr: MSR_PKG_ENERGY_STATUS, start: 0x1000, unitsPerSecond: 200_000 });
    pump.start();
    cleanups.push(() => pump.stop());
    const dir = tempDir('vmsr-record-restart-');
    cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
    const sock = path.join(dir, 'helper.sock');
    const trace = path.join(dir, 'live.jsonl.gz');
    // Registered VMs only: with discovery the trace would also hold every other QEMU on this machine.
    const h = await startHelper(['-k', sock, ...hostArgs(host), '--interval', '0.2', '--no-discovery', '--record', trace]);
    cleanups.push(() => h.stop('SIGKILL'));

    const busy = await burningVm(150);
    const light = await burningVm(600);
    const resumed: number[] = [];
    const c = await ResumingV2Client.connect(sock, { onResumed: (r) => resumed.push(r.awayMs) });
    cleanups.push(() => c.close());
    const regs = [await c.register({ pid: busy.vm.pid, vcpus: busy.vcpus }), await c.register({ pid: light.vm.pid, vcpus: light.vcpus })];
    const updates = new Map<number, number>();
    for (const r of regs) await c.subscribe(r.vmId, (u) => updates.set(u.vmId, (updates.get(u.vmId) ?? 0) + 1));
    const updatesOf = (id: number) => updates.get(id) ?? 0;
    await waitFor(() => regs.every((r) => updatesOf(r.vmId) >= 5), 'updates before the first restart', h, 15_000);

    const handedOver = () => h.stderr().split('"msg":"handed over:').length - 1;
    for (let i = 0; i < RESTARTS; i++) {
      const before = handedOver();
      if (i % 2 === 0) h.proc.kill('SIGHUP');
      else await run(process.execPath, [BIN, 'reload', '-k', sock], { timeout: 30_000 });
      await waitFor(() => handedOver() > before, `restart ${i + 1} to serve again`, h, 30_000);
      await waitFor(() => resumed.length > i, `the client to resume after restart ${i + 1}`, h, 30_000);
      const at = regs.map((r) => updatesOf(r.vmId));
      await waitFor(() => regs.every((r, k) => updatesOf(r.vmId) >= at[k]! + 3), `updates after restart ${i + 1}`, h, 15_000);
    }
    expect(h.stderr().split('"msg":"recording goes on after the restart"').length - 1, 'each new image went on with the trace').toBe(
      RESTARTS,
    );

    // The live totals and the end of the VMs' registrations in one write: no sample in between.
    const v2 = await c.ready();
    const [b0, b1, l0, l1] = await Promise.all([
      v2.read(regs[0]!.vmId, 0),
      v2.read(regs[0]!.vmId, 1),
      v2.read(regs[1]!.vmId, 0),
      v2.read(regs[1]!.vmId, 1),
      v2.unregister(regs[0]!.vmId),
      v2.unregister(regs[1]!.vmId),
    ]);
    await c.close();
    expect(await h.stop('SIGTERM')).toBe(0); // the shutdown hook closes the trace

    const { stdout } = await run(process.execPath, [BIN, 'replay', '--json', trace], { maxBuffer: 64 << 20 });
    const total = JSON.parse(stdout.trim().split('\n').at(-1)!) as ReplayTotal;
    expect(total.type).toBe('total');
    const replayed = (pid: number) => {
      const vms = total.vms.filter((v) => v.pid === pid);
      expect(vms, `one VM of pid ${pid} in the trace (its takeovers after restarts registered nothing new)`).toHaveLength(1);
      return vms[0]!.vpkgs.map((v) => BigInt(v.energy_uj));
    };
    const live = [
      [b0!.energyUj, b1!.energyUj],
      [l0!.energyUj, l1!.energyUj],
    ];
    const fromTrace = [replayed(busy.vm.pid), replayed(light.vm.pid)];
    const diffs = live.flatMap((vpkgs, k) => vpkgs.map((e, g) => e - fromTrace[k]![g]!));
    const largest = diffs.reduce((m, d) => ((d < 0n ? -d : d) > m ? (d < 0n ? -d : d) : m), 0n);
    console.log(
      `${RESTARTS} restarts in place (resumed after ${resumed.join(', ')} ms): live totals (µJ) ${live.map((v) => v.join('/')).join(', ')}; ` +
        `replayed ${fromTrace.map((v) => v.join('/')).join(', ')}; largest difference ${largest} µJ (allowed ${ROUNDING_UJ})`,
    );
    expect(live[0]![0]!, 'the busy VM got energy').toBeGreaterThan(0n);
    expect(live[0]![0]!, 'more than the light one').toBeGreaterThan(live[1]![0]!);
    expect(largest).toBeLessThanOrEqual(ROUNDING_UJ);
  }, 180_000);
});
