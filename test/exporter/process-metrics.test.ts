import { afterEach, describe, expect, test } from 'vitest';
import { EnergyBook } from '../../src/exporter/energy-book.js';
import { startMetricsServer, type MetricsServer } from '../../src/exporter/http-server.js';
import { BUILD_INFO, MISNAMED_DEFAULTS } from '../../src/exporter/process-metrics.js';
import { findPackage } from '../../src/os/package-info.js';

let server: MetricsServer | null = null;
afterEach(async () => {
  await server?.close();
  server = null;
});

async function scrape(accept?: string): Promise<string> {
  server ??= await startMetricsServer(new EnergyBook(), { host: '127.0.0.1', port: 0 });
  const r = await fetch(`http://127.0.0.1:${server.address.port}/metrics`, accept ? { headers: { accept } } : {});
  expect(r.status).toBe(200);
  return r.text();
}

describe('the exporter own series', () => {
  test('vmsr_build_info carries the package version and the Node version, value 1', async () => {
    const body = await scrape();
    const m = new RegExp(`^${BUILD_INFO}\\{version="([^"]+)",revision="([^"]+)",nodeversion="([^"]+)"\\} 1$`, 'm').exec(body);
    expect(m).not.toBeNull();
    expect(m![1]).toBe(findPackage()!.version);
    expect(m![3]).toBe(process.version);
  });

  test('the process self-metrics are there under their usual names, without the misnamed _total gauges', async () => {
    const body = await scrape();
    for (const name of [
      'process_cpu_seconds_total',
      'process_resident_memory_bytes',
      'process_open_fds',
      'process_start_time_seconds',
      'nodejs_heap_size_used_bytes',
    ])
      expect(body).toMatch(new RegExp(`^${name} \\d`, 'm'));
    const rss = Number(/^process_resident_memory_bytes (\d+)/m.exec(body)![1]);
    expect(rss).toBeGreaterThan(10 * 1024 * 1024);
    for (const name of MISNAMED_DEFAULTS) expect(body).not.toContain(`${name} `);
  });

  test('the OpenMetrics body ends with one # EOF after the process series', async () => {
    const body = await scrape('application/openmetrics-text; version=1.0.0');
    expect(body.match(/^# EOF$/gm)).toHaveLength(1);
    expect(body.endsWith('# EOF\n')).toBe(true);
    expect(body).toMatch(/^process_cpu_seconds_total \d/m);
    expect(body).toMatch(/^vmsr_exporter_helper_connected 0$/m);
  });
});
