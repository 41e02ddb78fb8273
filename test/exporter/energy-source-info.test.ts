/**
 * vmsr_energy_source_info: present with the source the exporter was told, absent when it was told
 * nothing (no guess). Through the real metrics HTTP server. The demo's end-to-end scrape is in
 * test/cli/demo.test.ts.
 */
import { afterEach, describe, expect, test } from 'vitest';
import { EnergyBook } from '../../src/exporter/energy-book.js';
import { ENERGY_SOURCE_INFO } from '../../src/exporter/energy-source-info.js';
import { startMetricsServer, type MetricsServer } from '../../src/exporter/http-server.js';

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

  test('the series names the source the exporter was told', async () => {
    const book = new EnergyBook();
    book.energySourceNote = 'synthetic';
    const text = await scrape(book);
    expect(text).toMatch(/^vmsr_energy_source_info\{source="synthetic"\} 1$/m);
    expect(text).toMatch(/^# HELP vmsr_energy_source_info .*synthetic: not a measurement/m);
  });

  test('the series is absent when the exporter was told nothing', async () => {
    const text = await scrape(new EnergyBook());
    expect(text).not.toMatch(new RegExp(`^${ENERGY_SOURCE_INFO}\\{`, 'm'));
  });
});
