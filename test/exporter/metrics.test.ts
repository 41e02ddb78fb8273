/**
 * The exposition over the real HTTP server, from a book fed with updates: names, base units, labels,
 * OpenMetrics on request, promtool's lint, bad requests and --listen parsing.
 */
import { execFileSync } from 'node:child_process';
import { afterEach, describe, expect, test } from 'vitest';
import { EnergyBook } from '../../src/exporter/energy-book.js';
import { startMetricsServer, type MetricsServer } from '../../src/exporter/http-server.js';
import { negotiateFormat } from '../../src/exporter/metrics.js';
import { backoffDelay } from '../../src/exporter/observer-session.js';
import { missing } from '../support/env.js';
import { hostStats } from '../support/helper-messages.js';

let server: MetricsServer | null = null;
afterEach(async () => {
  await server?.close();
  server = null;
});

function fedBook(): EnergyBook {
  const b = new EnergyBook();
  b.connectionStarted();
  b.listed([
    {
      hostVmId: 1,
      pid: 4242,
      uid: 0,
      starttime: 77n,
      name: 'web "1"',
      uuid: '6f1c1a7e-0000-4000-8000-000000000001',
      source: 'discovered',
      nvpkg: 2,
      ended: false,
      wholeVmOnly: false,
    },
    {
      hostVmId: 2,
      pid: 4343,
      uid: 107,
      starttime: 78n,
      name: null,
      uuid: null,
      source: 'registered',
      nvpkg: 1,
      ended: false,
      wholeVmOnly: true,
    },
  ]);
  const u = (id: number, t: bigint, uj: bigint[]) =>
    b.vmUpdate({ hostVmId: id, tNs: t, ended: false, vpkgs: uj.map((energyUj) => ({ counter: 0n, energyUj })) });
  u(1, 1_000_000_000n, [1_000_000n, 0n]);
  u(1, 2_000_000_000n, [3_500_000n, 250_000n]);
  u(2, 1_000_000_000n, [100n]);
  b.hostUpdate(
    {
      tNs: 2_000_000_000n,
      packages: [
        { pkg: 0, energyUj: 10_000_000n, unattributedUj: 6_000_000n },
        { pkg: 1, energyUj: 500_000n, unattributedUj: 250_000n },
      ],
      unattributedUj: 6_250_000n,
      vmsChanged: false,
      stats: {
        legacyOk: 12n,
        legacyRefused: 2n,
        legacyFailed: 1n,
        lastSampleDurationNs: 1_500_000n,
        samples: 20n,
        sampleFailures: 1n,
        connections: 3,
        vms: 2,
      },
    },
    [
      { domain: 'dram', pkg: 0, energyUj: 2_000_000n, unattributedUj: 1_000_000n },
      { domain: 'dram', pkg: 1, energyUj: 400_000n, unattributedUj: 300_000n },
      { domain: 'psys', pkg: 0, energyUj: 30_000_000n, unattributedUj: 20_000_000n },
    ],
  );
  return b;
}

async function scrape(accept?: string): Promise<{ type: string; body: string; status: number }> {
  const r = await fetch(`http://127.0.0.1:${server!.address.port}/metrics`, { headers: accept ? { accept } : {} });
  return { type: r.headers.get('content-type') ?? '', body: await r.text(), status: r.status };
}

describe('exporter metrics', () => {
  test('the Prometheus text format has every series in base units with its labels', async () => {
    server = await startMetricsServer(fedBook(), { host: '127.0.0.1', port: 0 });
    const { type, body } = await scrape();
    expect(type).toMatch(/^text\/plain; version=0\.0\.4/);
    const vm1 = 'name="web \\"1\\"",uuid="6f1c1a7e-0000-4000-8000-000000000001",pid="4242",uid="0"';
    expect(body).toContain(`vmsr_vm_energy_joules_total{${vm1},vpkg="0",domain="package"} 3.5\n`);
    expect(body).toContain(`vmsr_vm_energy_joules_total{${vm1},vpkg="1",domain="package"} 0.25\n`);
    expect(body).toContain(`vmsr_vm_power_watts{${vm1},vpkg="0",domain="package"} 2.5\n`);
    expect(body).toContain(`vmsr_vm_power_watts{${vm1},vpkg="1",domain="package"} 0.25\n`);
    expect(body).not.toMatch(/vmsr_vm_power_watts\{[^}]*pid="4343"/); // one sample only: no power yet
    expect(body).toContain('vmsr_vm_energy_joules_total{name="",uuid="",pid="4343",uid="107",vpkg="0",domain="package"} 0.0001\n');
    expect(body).toContain(`vmsr_vm_info{${vm1},source="discovered",whole_vm_only="0",sampled_whole="1"} 1\n`);
    expect(body).toContain(
      'vmsr_vm_info{name="",uuid="",pid="4343",uid="107",source="registered",whole_vm_only="1",sampled_whole="1"} 1\n',
    );
    expect(body).toContain('vmsr_host_package_energy_joules_total{package="0",domain="package"} 10\n');
    expect(body).toContain('vmsr_host_package_energy_joules_total{package="1",domain="package"} 0.5\n');
    expect(body).toContain('vmsr_host_package_unattributed_energy_joules_total{package="0",domain="package"} 6\n');
    expect(body).toContain('vmsr_host_package_unattributed_energy_joules_total{package="1",domain="package"} 0.25\n');
    expect(body).toContain('vmsr_unattributed_energy_joules_total{domain="package"} 6.25\n');
    // The other RAPL domains the helper's host file gives, per package it is read on; unattributed summed over packages.
    expect(body).toContain('vmsr_host_package_energy_joules_total{package="0",domain="dram"} 2\n');
    expect(body).toContain('vmsr_host_package_energy_joules_total{package="1",domain="dram"} 0.4\n');
    expect(body).toContain('vmsr_host_package_energy_joules_total{package="0",domain="psys"} 30\n');
    expect(body).not.toContain('{package="1",domain="psys"}');
    expect(body).toContain('vmsr_host_package_unattributed_energy_joules_total{package="1",domain="dram"} 0.3\n');
    expect(body).toContain('vmsr_unattributed_energy_joules_total{domain="dram"} 1.3\n');
    expect(body).toContain('vmsr_unattributed_energy_joules_total{domain="psys"} 20\n');
    expect(body).toContain('vmsr_helper_samples_total 20\n');
    expect(body).toContain('vmsr_helper_sample_failures_total 1\n');
    expect(body).toContain('vmsr_helper_vms 2\n');
    expect(body).toContain('vmsr_helper_legacy_requests_total{result="refused"} 2\n');
    expect(body).toContain('vmsr_helper_connections 3\n');
    expect(body).toContain('vmsr_helper_sample_duration_seconds 0.0015\n');
    expect(body).toMatch(/\nvmsr_helper_last_sample_age_seconds \d/);
    expect(body).toContain('vmsr_exporter_helper_connected 1\n');
  });

  test('before the first host update, host and health values are absent rather than 0', async () => {
    server = await startMetricsServer(new EnergyBook(), { host: '127.0.0.1', port: 0 });
    const { body } = await scrape();
    expect(body).not.toMatch(/^vmsr_host_package_(unattributed_)?energy_joules_total\{/m);
    for (const absent of [
      'vmsr_unattributed_energy_joules_total{',
      'vmsr_unattributed_energy_joules_total ',
      'vmsr_helper_last_sample_age_seconds ',
      'vmsr_helper_sample_duration_seconds ',
      'vmsr_helper_samples_total ',
      'vmsr_helper_vms ',
      'vmsr_helper_connections ',
    ]) {
      expect(body).not.toContain(`\n${absent}`);
    }
    expect(body).toContain('\nvmsr_exporter_helper_connected 0\n');
    expect(body).toContain('\nvmsr_exporter_helper_connects_total 0\n');
  });

  test('a helper that sends no per-package unattributed energy gets the host-wide series only', async () => {
    const old = new EnergyBook();
    const stats = hostStats({ samples: 1n, connections: 1 });
    old.hostUpdate({
      tNs: 1n,
      packages: [{ pkg: 0, energyUj: 2_000_000n, unattributedUj: null }],
      unattributedUj: 1_500_000n,
      vmsChanged: false,
      stats,
    });
    server = await startMetricsServer(old, { host: '127.0.0.1', port: 0 });
    const { body } = await scrape();
    expect(body).toContain('vmsr_host_package_energy_joules_total{package="0",domain="package"} 2\n');
    expect(body).toContain('vmsr_unattributed_energy_joules_total{domain="package"} 1.5\n');
    expect(body).not.toMatch(/^vmsr_host_package_unattributed_energy_joules_total\{/m);
  });

  test('OpenMetrics is served when the scraper asks for it, and ends with # EOF', async () => {
    server = await startMetricsServer(fedBook(), { host: '127.0.0.1', port: 0 });
    const om = await scrape('application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1');
    expect(om.type).toMatch(/^application\/openmetrics-text; version=1\.0\.0/);
    expect(om.body).toContain('# TYPE vmsr_vm_energy_joules counter\n');
    expect(om.body).toMatch(/\nvmsr_vm_energy_joules_total\{[^}]*pid="4242",uid="0",vpkg="0",domain="package"\} 3\.5\n/);
    expect(om.body.endsWith('# EOF\n')).toBe(true);
    // The Prometheus format after an OpenMetrics scrape still names counters with _total.
    const text = await scrape();
    expect(text.body).toContain('# TYPE vmsr_vm_energy_joules_total counter\n');
    expect(negotiateFormat('application/openmetrics-text;q=0')).toBe('prometheus');
    expect(negotiateFormat(undefined)).toBe('prometheus');
  });

  test('promtool check metrics passes on the exposition', async (ctx) => {
    const why = missing({ command: 'promtool' });
    if (why) return ctx.skip(`${why} (apt-get install prometheus)`);
    server = await startMetricsServer(fedBook(), { host: '127.0.0.1', port: 0 });
    const { body } = await scrape();
    const out = execFileSync('sh', ['-c', 'promtool check metrics 2>&1; echo "rc=$?"'], { input: body, encoding: 'utf8' });
    expect(out.trim()).toBe('rc=0');
  });

  test('other paths are 404 and other methods 405, with a hint', async () => {
    server = await startMetricsServer(fedBook(), { host: '127.0.0.1', port: 0 });
    const base = `http://127.0.0.1:${server.address.port}`;
    const nf = await fetch(`${base}/nope`);
    expect(nf.status).toBe(404);
    expect(await nf.text()).toContain('/metrics');
    const post = await fetch(`${base}/metrics`, { method: 'POST', body: 'x' });
    expect(post.status).toBe(405);
    expect((await fetch(`${base}/`)).status).toBe(200);
  });

  test('a port in use is refused with the fix', async () => {
    server = await startMetricsServer(new EnergyBook(), { host: '127.0.0.1', port: 0 });
    await expect(startMetricsServer(new EnergyBook(), { host: '127.0.0.1', port: server.address.port })).rejects.toThrow(
      /EADDRINUSE; .*--listen \[HOST\]:PORT/,
    );
  });
});

describe('backoff', () => {
  test('reconnect delays double from the first and stop at the maximum', () => {
    const b = { firstMs: 250, maxMs: 10_000 };
    expect([0, 1, 2, 3, 5, 6, 100].map((a) => backoffDelay(b, a))).toEqual([250, 500, 1000, 2000, 8000, 10_000, 10_000]);
  });
});
