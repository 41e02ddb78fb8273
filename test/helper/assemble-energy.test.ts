/** The daemon's chain takes its energy source from the one factory: the RAPL MSRs unless told otherwise. */
import { pino } from 'pino';
import { afterEach, describe, expect, test } from 'vitest';
import type { EnergySourceKind } from '../../src/energy/kinds.js';
import { assembleV2, type V2Chain } from '../../src/helper/assemble.js';
import { DEFAULT_V2_LIMITS } from '../../src/helper/v2/v2-limits.js';
import { MsrDevice } from '../../src/msr/device.js';
import { FakeHost } from '../support/fake-host.js';

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function setup(): { fake: FakeHost; device: MsrDevice } {
  const fake = new FakeHost({ packages: [0, 0, 1, 1] });
  const device = new MsrDevice(fake.msrPathTemplate);
  cleanups.push(
    () => fake.cleanup(),
    () => device.close(),
  );
  return { fake, device };
}

async function chain(fake: FakeHost, device: MsrDevice, energySource?: EnergySourceKind): Promise<V2Chain> {
  const c = await assembleV2({
    paths: fake.hostPaths(),
    device,
    vendor: 'intel',
    intervalMs: 1000,
    limits: DEFAULT_V2_LIMITS,
    log: pino({ level: 'silent' }),
    ...(energySource ? { energySource } : {}),
  });
  cleanups.push(() => c.close());
  return c;
}

describe('assembleV2 energy source', () => {
  test('reads each package power unit from the RAPL MSRs when no source is named', async () => {
    const { fake, device } = setup();
    fake.writeRapl({ powerUnit: 0xa1003n });
    expect((await chain(fake, device)).host.packages.map((p) => [p.pkg, p.powerUnit])).toEqual([
      [0, 0xa1003n],
      [1, 0xa1003n],
    ]);
  });

  test('fails with the MSR read error when the RAPL registers cannot be read and no source is named', async () => {
    const { fake, device } = setup(); // MSR files without any register: every read is short
    await expect(chain(fake, device)).rejects.toThrow(/cannot read MSR 0x606 on CPU 0: short read/);
  });

  test('builds on a host without RAPL registers when given the synthetic source, reading no MSR', async () => {
    const { fake, device } = setup();
    const c = await chain(fake, device, 'synthetic');
    expect(c.host.packages).toEqual([
      { pkg: 0, powerUnit: 0xa0e03n },
      { pkg: 1, powerUnit: 0xa0e03n },
    ]);
    expect(device.openFds()).toEqual([]);
  });
});
