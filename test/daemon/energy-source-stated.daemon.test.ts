/**
 * The daemon states its energy source in the host statistics file (`energy_source`, docs/stats-fd.md):
 * a real daemon on RAPL MSR files says msr, one on --energy-source synthetic says synthetic, read by a
 * real v2 client through the fd the daemon hands over.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { V2Client } from '../../src/client/v2-client.js';
import { StatsReader } from '../../src/client/stats-reader.js';
import { ENERGY_SOURCE_CODE, energySourceOfCode } from '../../src/energy/kinds.js';
import { FakeHost } from '../support/fake-host.js';
import { hostArgs, spawnHelper, tempDir, waitFor } from './support/daemon-process.js';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function statedSource(extra: string[]): Promise<bigint | undefined> {
  const fake = new FakeHost({ packages: [0, 0] });
  fake.writeRapl({ powerUnit: 0xa0e03n, energy: { 0: 0x1000 } });
  cleanups.push(() => fake.cleanup());
  const dir = tempDir('vmsr-source-');
  cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
  const sock = path.join(dir, 'helper.sock');
  const helper = spawnHelper(['-k', sock, '-f', path.join(dir, 'pid'), ...hostArgs(fake), '--no-discovery', ...extra]);
  cleanups.push(() => helper.stop('SIGKILL'));
  await waitFor(() => helper.stderr().includes('"msg":"Listening on'), 'the helper to listen', helper, 30_000);
  const c = await V2Client.connect(sock);
  cleanups.push(() => c.close());
  const r = StatsReader.open((await c.statsFd(0)).fd);
  try {
    return r.value(r.read(), 'energy_source');
  } finally {
    r.close();
  }
}

describe("the host statistics file's energy_source", () => {
  test('a daemon reading RAPL MSRs states msr in its host statistics file', async () => {
    const v = await statedSource(['--energy-source', 'msr']);
    expect(v).toBe(BigInt(ENERGY_SOURCE_CODE.msr));
    expect(energySourceOfCode(Number(v))).toBe('msr');
  }, 60_000);

  test('a daemon on synthetic energy states synthetic in its host statistics file', async () => {
    const v = await statedSource(['--energy-source', 'synthetic']);
    expect(energySourceOfCode(Number(v))).toBe('synthetic');
  }, 60_000);
});
