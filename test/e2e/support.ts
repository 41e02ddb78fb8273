/**
 * What the real-guest tests of restarts and crashes share: a test that needs a RAPL QEMU (skipped with
 * the reason when it cannot run here), the fake Intel package with its counter pumped, and a process's
 * start time (the same QEMU process all along when it does not change).
 */
import fs from 'node:fs';
import { test } from 'vitest';
import { parseStatLine } from '../../src/ratio/stat.js';
import { tempDir } from '../daemon/support/daemon-process.js';
import { EnergyPump } from '../support/energy-pump.js';
import { raplFakeHost } from '../support/rapl-host.js';
import { raplQemuMissing } from '../support/rapl-qemu.js';

/** The start time of a process (field 22 of its stat line). */
export function starttime(pid: number): number {
  const parsed = parseStatLine(fs.readFileSync(`/proc/${pid}/stat`, 'latin1'));
  if (!parsed.ok) throw new Error(`cannot parse /proc/${pid}/stat: ${parsed.error}`);
  return parsed.value.starttime;
}

/** A test needing a RAPL QEMU: skipped with the reason when it cannot run here. */
export function raplTest(name: string, body: (skip: (why: string) => void) => Promise<void>, timeoutMs: number): void {
  test(
    name,
    async (ctx) => {
      const why = raplQemuMissing();
      if (why) return ctx.skip(why);
      await body((w) => ctx.skip(w));
    },
    timeoutMs,
  );
}

/** The fake Intel package, its counter from `start` at `rate` units a second, and a temp dir; cleaned up through `onCleanup`. */
export function pumpedRaplHost(
  onCleanup: (c: () => void) => void,
  o: { start: number; rate: number; prefix: string },
): { host: ReturnType<typeof raplFakeHost>['host']; dir: string } {
  const { host, energyMsr } = raplFakeHost('intel', o.start);
  onCleanup(() => host.cleanup());
  const pump = new EnergyPump(host, { msr: energyMsr, start: o.start, unitsPerSecond: o.rate });
  pump.start();
  onCleanup(() => pump.stop());
  const dir = tempDir(o.prefix);
  onCleanup(() => fs.rmSync(dir, { recursive: true, force: true }));
  return { host, dir };
}
