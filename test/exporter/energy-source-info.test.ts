/**
 * vmsr_energy_source_info: present with the source the daemon's host statistics file states, absent
 * when it states none (no guess). Through the real metrics HTTP server. The demo's end-to-end scrape is in
 * test/cli/demo.test.ts.
 */
import { afterEach, describe, expect, test } from 'vitest';
import { EnergyBook } from '../../src/exporter/energy-book.js';
import { startMetricsServer, type MetricsServer } from '../../src/exporter/http-server.js';
import { ENERGY_SOURCE_CODE, ENERGY_SOURCE_KINDS, energySourceOfCode } from '../../src/energy/kinds.js';
import { METRIC } from '../../src/exporter/metrics.js';

describe('vmsr_energy_source_info', () => {
  let server: MetricsServer | undefined;
  afterEach(async () => {
    await server?.close();
    server = undefined;
  });

  async function scrape(book: EnergyBook): Promise<string> {
    server = await startMetricsServer(book, { host: '127.0.0.1', port: 0 });
    return (await fetch(`http://127.0.0.1:${server.address.port}/metrics`)).text();
  }

  test('the series names the source the daemon stated', async () => {
    const book = new EnergyBook();
    book.energySource = 'synthetic';
    const text = await scrape(book);
    expect(text).toMatch(/^vmsr_energy_source_info\{source="synthetic"\} 1$/m);
    expect(text).toMatch(/^# HELP vmsr_energy_source_info .*synthetic \(not a measurement\)$/m);
  });

  test('the series is absent when the daemon did not say', async () => {
    const text = await scrape(new EnergyBook());
    expect(text).not.toMatch(new RegExp(`^${METRIC.energySource}\\{`, 'm'));
  });
});

describe('energy source codes', () => {
  test('each kind has its own code, 0 and unknown codes give no kind', () => {
    expect(ENERGY_SOURCE_KINDS.map((k) => energySourceOfCode(ENERGY_SOURCE_CODE[k]))).toEqual([...ENERGY_SOURCE_KINDS]);
    expect(new Set(Object.values(ENERGY_SOURCE_CODE)).size).toBe(ENERGY_SOURCE_KINDS.length);
    for (const code of [0, 4, 255, -1, 1.5, Number.NaN, undefined, 0n, 4n, 2n ** 64n - 1n])
      expect(energySourceOfCode(code), String(code)).toBeNull();
    expect(energySourceOfCode(3n)).toBe('synthetic');
  });
});
