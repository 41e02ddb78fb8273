/**
 * The exporter and a real Prometheus across restarts in place (docs/daemon.md "Restarts"): the real
 * daemon discovers a fake QEMU, the real exporter observes it, Prometheus scrapes every second, and
 * the daemon is restarted twice by SIGHUP. No series resets, the VM keeps its one series per virtual
 * package (same labels, same host VM id in the daemon's list), and the energy goes on after the restarts.
 */
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { V2Client } from '../../src/client/v2-client.js';
import { FakeQemu } from '../support/fake-qemu.js';
import { missing } from '../support/env.js';
import { listenings, tempDir, waitFor } from '../daemon/support/daemon-process.js';
import { MovingHost, startDaemon, startExporterChild, startPrometheus } from '../exporter/support/stack.js';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const NAME = `restart-vm-${process.pid}`;

/** Polls the async `cond` every 250 ms until it holds, or throws naming `what` after `ms`. */
async function until(cond: () => Promise<boolean>, what: string, ms: number): Promise<void> {
  const end = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

describe('the exporter across restarts in place', () => {
  test('Prometheus sees no reset and the same series of a discovered VM across two SIGHUP restarts, its energy going on', async (ctx) => {
    const why = missing({ command: 'prometheus' });
    if (why) return ctx.skip(`${why} (.ci/run installs prometheus)`);
    const h = new MovingHost();
    h.pump(50);
    cleanups.push(() => h.cleanup());
    const sock = path.join(tempDir('vmsr-exp-restart-'), 'helper.sock');
    const daemon = await startDaemon(h, sock);
    cleanups.push(() => daemon.stop('SIGKILL'));
    const vm = new FakeQemu({ vcpus: 2, args: ['-name', `guest=${NAME},debug-threads=on`, '-smp', '2,sockets=2'] });
    cleanups.push(() => vm.kill());
    await vm.ready();
    await vm.cmd('spin 0');
    await vm.cmd('spin 1');
    const exporter = await startExporterChild(sock);
    cleanups.push(() => exporter.stop('SIGKILL'));
    const prom = await startPrometheus(new URL(exporter.url).host);
    cleanups.push(() => prom.stop());
    const ours = `{name="${NAME}"}`;
    const energy = async () => (await prom.query(`sum(vmsr_vm_energy_joules_total${ours})`))[0]?.value[1];
    await until(async () => Number(await energy()) > 0, 'the VM in Prometheus', 30_000);
    const hostId = async () => {
      const c = await V2Client.connect(sock);
      try {
        return (await c.list()).filter((v) => v.pid === vm.pid).map((v) => v.hostVmId);
      } finally {
        await c.close();
      }
    };
    const idBefore = await hostId();
    expect(idBefore).toHaveLength(1);

    for (let i = 1; i <= 2; i++) {
      daemon.proc.kill('SIGHUP');
      await waitFor(
        () => listenings(daemon) > i,
        `restart ${i} to take the next restart (its binary check may take 30 s on a busy host)`,
        daemon,
        60_000,
      );
      await new Promise((r) => setTimeout(r, 3_000));
    }
    const afterRestarts = Number(await energy());
    await until(async () => Number(await energy()) > afterRestarts, 'the energy going on after the restarts', 20_000);

    expect(await hostId()).toEqual(idBefore);
    // One series per virtual package, the same ones all along, and none of them ever reset.
    const series = await prom.query(`count by (vpkg, pid, uid) (count_over_time(vmsr_vm_energy_joules_total${ours}[5m]))`);
    expect(series.map((s) => s.metric.vpkg).sort()).toEqual(['0', '1']);
    const resets = await prom.query(`resets(vmsr_vm_energy_joules_total${ours}[5m])`);
    expect(resets.map((r) => r.value[1])).toEqual(['0', '0']);
    const hostResets = await prom.query('resets(vmsr_host_package_energy_joules_total[5m])');
    expect(hostResets.every((r) => r.value[1] === '0')).toBe(true);
    expect(exporter.proc.exitCode).toBeNull();
  }, 240_000); // two restarts, each waited for up to 60 s on a busy host
});
