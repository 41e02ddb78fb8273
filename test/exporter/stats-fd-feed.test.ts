/**
 * The exporter reading its values from the helper's statistics fds at scrape time, against the real
 * v2 service on a real socket: what /metrics says for a VM and the host equals what their files hold
 * for the same sample, and between scrapes the exporter is sent nothing per sample.
 */
import fs from 'node:fs';
import type { Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { pino } from 'pino';
import { V2Client } from '../../src/client/v2-client.js';
import { StatsReader } from '../../src/client/stats-reader.js';
import { startExporter } from '../../src/exporter/exporter-process.js';
import { startChild, startHarness, threadsOf, until } from '../v2/harness.js';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** The value of the first series of `metric` whose labels contain `has` (or any when absent). */
function metric(body: string, metric: string, has = ''): number | undefined {
  const line = body
    .split('\n')
    .find((l) => l.startsWith(metric) && (l[metric.length] === '{' || l[metric.length] === ' ') && l.includes(has));
  return line === undefined ? undefined : Number(line.slice(line.lastIndexOf(' ') + 1));
}

describe('the exporter on statistics fds', () => {
  it('exports at scrape time what the VM and host files hold for the same sample, and is sent nothing per sample', async () => {
    const h = await startHarness({ intervalMs: 300 });
    cleanups.push(() => h.close());
    const child = startChild('spin');
    cleanups.push(() => child.kill());
    await until(() => fs.existsSync(`/proc/${child.pid}/task`));
    const c = await V2Client.connect(h.socketPath);
    cleanups.push(() => c.close());
    const vmId = (await c.register({ pid: child.pid, vcpus: [{ tid: threadsOf(child.pid)[0]!, vpkg: 0 }] })).vmId;
    let received = 0;
    const exporter = await startExporter(
      { socketPath: h.socketPath, listen: { host: '127.0.0.1', port: 0 }, maxExportedVms: 100 },
      async () => {
        const client = await V2Client.connect(h.socketPath);
        // Count what the helper sends this connection after the first scrape: no per-sample frame may come.
        (client as unknown as { socket: Socket }).socket.on('data', (d: Buffer) => (received += d.length));
        return client;
      },
      pino({ level: 'silent' }),
    );
    cleanups.push(() => exporter.stop());
    const vmFile = StatsReader.open((await c.statsFd(vmId)).fd);
    const hostFile = StatsReader.open((await c.statsFd(0)).fd);
    cleanups.push(
      () => vmFile.close(),
      () => hostFile.close(),
    );
    const scrape = async () => (await fetch(exporter.url)).text();
    h.addEnergy(200_000);
    await until(() => vmFile.value(vmFile.read(), 'energy')! > 0n);
    for (let i = 0; ; i++) {
      const before = vmFile.read().generation;
      const body = await scrape();
      const s = vmFile.read();
      const hs = hostFile.read();
      if (s.generation !== before) {
        if (i < 20) continue;
        throw new Error('no scrape fell within one sample');
      }
      expect(metric(body, 'vmsr_vm_energy_joules_total', `pid="${child.pid}"`)).toBeCloseTo(Number(vmFile.value(s, 'energy')) / 1e6, 6);
      expect(metric(body, 'vmsr_vm_power_watts', `pid="${child.pid}"`)).toBeCloseTo(Number(vmFile.value(s, 'power')) / 1e6, 6);
      expect(metric(body, 'vmsr_host_package_energy_joules_total', 'package="0"')).toBeCloseTo(
        Number(hostFile.values(hs, 'package_energy')![0]) / 1e6,
        6,
      );
      expect(metric(body, 'vmsr_helper_samples_total')).toBe(Number(hostFile.value(hs, 'samples')));
      break;
    }
    // Three intervals without a scrape: the helper sends the exporter nothing.
    const quietFrom = received;
    const g0 = hostFile.read().generation;
    await until(() => hostFile.read().generation >= g0 + 6n, 5000, 'three samples');
    expect(received).toBe(quietFrom);
  });
});
