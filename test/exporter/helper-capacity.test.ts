/**
 * The helper's VM caps and fd budget as series: read by name from a host statistics file written by
 * the daemon's own writer (a file with every part, one with discovery off and no fd budget, and one
 * of a daemon that predates them), then served through the real metrics HTTP server. A value the
 * file does not hold has no series. The live daemon driven to its cap, scraped by Prometheus, is
 * test/contrib/capacity-alerts.prometheus.test.ts.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, afterEach, describe, expect, test } from 'vitest';
import { StatsReader } from '../../src/client/stats-reader.js';
import { EnergyBook } from '../../src/exporter/energy-book.js';
import { CAPACITY_METRIC, capacityFromFile } from '../../src/exporter/helper-capacity.js';
import { startMetricsServer, type MetricsServer } from '../../src/exporter/http-server.js';
import { hostStatsLayout, writeHostStats, type HostCapacity, type HostStatsValues } from '../../src/protocol/stats/host-file.js';
import { encodeStatsFile, planStatsLayout, type StatsLayout } from '../../src/protocol/stats/layout.js';
import { SampleBlock } from '../../src/protocol/stats/sample-block.js';
import { tempDir } from '../daemon/support/daemon-process.js';

const dir = tempDir('vmsr-capacity-');
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));
let server: MetricsServer | undefined;
afterEach(async () => {
  await server?.close();
  server = undefined;
});

const VALUES: Omit<HostStatsValues, 'capacity'> = {
  monotonicNs: 5n,
  realtimeNs: 6n,
  nextMonotonicNs: 7n,
  intervalNs: 1n,
  packages: [{ pkg: 0, energyUj: 10n, unattributedUj: 4n }],
  unattributedUj: 4n,
  lastSampleDurationNs: 1n,
  samples: 3n,
  sampleFailures: 0n,
  legacyOk: 0n,
  legacyRefused: 0n,
  legacyFailed: 0n,
  vmChanges: 1n,
  connections: 2,
  vms: 9,
  energySource: 3,
};

/** A host file of `layout` holding `capacity`, written as the daemon writes it, opened through a StatsReader. */
function hostFile(layout: StatsLayout, capacity: HostCapacity, name: string): StatsReader {
  const bytes = encodeStatsFile(layout);
  const memory = new ArrayBuffer(bytes.length);
  new Uint8Array(memory).set(bytes);
  new SampleBlock(memory, layout).write((b) => writeHostStats(b, { ...VALUES, capacity }));
  const file = path.join(dir, name);
  fs.writeFileSync(file, new Uint8Array(memory));
  return StatsReader.open(fs.openSync(file, 'r'));
}

const FULL: HostCapacity = {
  registered: { used: 3, max: 1024 },
  discovered: { used: 2, max: 2 },
  fds: { open: 61, max: 20000, available: 15811 },
};

async function scrape(book: EnergyBook): Promise<string> {
  server = await startMetricsServer(book, { host: '127.0.0.1', port: 0 });
  return (await fetch(`http://127.0.0.1:${server.address.port}/metrics`)).text();
}

const seriesOf = (text: string, name: string) => text.split('\n').filter((l) => l.startsWith(`${name}{`) || l.startsWith(`${name} `));

describe('the helper capacity series', () => {
  test('each cap and the fd budget the host file states are series, the caps labelled by cap', async () => {
    const r = hostFile(hostStatsLayout(1234, 1, { capacity: { discovered: true, fds: true } }), FULL, 'full');
    const book = new EnergyBook();
    book.capacity = capacityFromFile(r, r.read());
    r.close();
    const text = await scrape(book);
    expect(seriesOf(text, CAPACITY_METRIC.vmCap).sort()).toEqual([
      'vmsr_helper_vm_cap{cap="discovery"} 2',
      'vmsr_helper_vm_cap{cap="registration"} 1024',
    ]);
    expect(seriesOf(text, CAPACITY_METRIC.vmCapUsed).sort()).toEqual([
      'vmsr_helper_vm_cap_used{cap="discovery"} 2',
      'vmsr_helper_vm_cap_used{cap="registration"} 3',
    ]);
    expect(seriesOf(text, CAPACITY_METRIC.openFds)).toEqual(['vmsr_helper_open_fds 61']);
    expect(seriesOf(text, CAPACITY_METRIC.maxFds)).toEqual(['vmsr_helper_max_fds 20000']);
    expect(seriesOf(text, CAPACITY_METRIC.fdsAvailable)).toEqual(['vmsr_helper_fds_available 15811']);
    expect(text).toMatch(/^# TYPE vmsr_helper_vm_cap gauge$/m);
  });

  test('a daemon with discovery off and no fd budget gives the registration cap only', async () => {
    // The writer is handed every part; the file made without their descriptors holds, and gives, none of them.
    const r = hostFile(hostStatsLayout(1234, 1), FULL, 'registration-only');
    const book = new EnergyBook();
    book.capacity = capacityFromFile(r, r.read());
    r.close();
    expect(book.capacity).toEqual({ caps: [{ cap: 'registration', used: 3, max: 1024 }], fds: null });
    const text = await scrape(book);
    expect(seriesOf(text, CAPACITY_METRIC.vmCap)).toEqual(['vmsr_helper_vm_cap{cap="registration"} 1024']);
    for (const name of [CAPACITY_METRIC.openFds, CAPACITY_METRIC.maxFds, CAPACITY_METRIC.fdsAvailable])
      expect(seriesOf(text, name), name).toEqual([]);
  });

  test('a daemon that predates the capacity descriptors, or no host file, gives no capacity series', async () => {
    const NEW = new Set([
      'vms_registered',
      'vms_registered_max',
      'vms_discovered',
      'vms_discovered_max',
      'fds_open',
      'fds_max',
      'fds_available',
    ]);
    const now = hostStatsLayout(1234, 1, { capacity: { discovered: true, fds: true } });
    const old = planStatsLayout(
      now.id,
      now.descriptors.filter((d) => !NEW.has(d.name)).map(({ name, flags, exponent, size }) => ({ name, flags, exponent, size })),
    );
    expect(old.descriptors.length).toBe(now.descriptors.length - NEW.size);
    const r = hostFile(old, FULL, 'old');
    const book = new EnergyBook();
    book.capacity = capacityFromFile(r, r.read());
    r.close();
    expect(book.capacity).toEqual({ caps: [], fds: null });
    for (const b of [book, new EnergyBook()]) {
      const text = await scrape(b);
      await server?.close();
      server = undefined;
      for (const name of Object.values(CAPACITY_METRIC)) expect(seriesOf(text, name), name).toEqual([]);
      expect(text).toContain('vmsr_exporter_helper_connected');
    }
  });
});
