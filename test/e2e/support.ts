/**
 * What the real-guest tests of restarts and crashes share: a test that needs a RAPL QEMU (skipped with
 * the reason when it cannot run here), the fake Intel package with its counter pumped, the helper on it
 * under a real systemd (fd store), the guest's serial read as it steps, and a process's start time (the
 * same QEMU process all along when it does not change).
 */
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'vitest';
import { parseStatLine } from '../../src/ratio/stat.js';
import { BIN, ensureBuilt, hostArgs, tempDir, waitFor } from '../daemon/support/daemon-process.js';
import { RealSystemd, UNIT } from '../restart/support/service-manager.js';
import { EnergyPump } from '../support/energy-pump.js';
import { raplFakeHost } from '../support/rapl-host.js';
import { GuestSerial, raplQemuMissing, type RaplQemu } from '../support/rapl-qemu.js';

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

/** The helper on a pumped RAPL host, run by a real systemd through its socket unit, listening. */
export interface RaplUnderSystemd {
  m: RealSystemd;
  dir: string;
  sock: string;
  /** The service's log so far. */
  log: () => string;
}

/**
 * Boots a real systemd (fd store) whose service runs the helper in server mode on a pumped RAPL host,
 * starts it and waits until it listens; all cleaned up through `cleanups`. Where systemd cannot run
 * here, logs and calls `skip` with the reason (for `what`), and returns undefined.
 */
export async function raplUnderSystemd(
  cleanups: (() => Promise<unknown> | void)[],
  skip: (why: string) => void,
  o: { start: number; rate: number; prefix: string; what: string; service?: string[] },
): Promise<RaplUnderSystemd | undefined> {
  ensureBuilt();
  const { host, dir } = pumpedRaplHost((c) => cleanups.push(c), o);
  const sock = path.join(dir, 'vmsr.sock');
  const logFile = path.join(dir, 'helper.log');
  const log = () => (fs.existsSync(logFile) ? fs.readFileSync(logFile, 'utf8') : '');
  let m: RealSystemd;
  try {
    const execStart = [process.execPath, BIN, ...hostArgs(host, 'intel'), '-T', 'server'];
    m = await RealSystemd.boot({ socket: sock, execStart, log: logFile, ...(o.service ? { service: o.service } : {}) }, dir);
  } catch (e) {
    const why = `systemd cannot run here: ${(e as Error).message.split('\n')[0]}`;
    console.log(`${o.what}: skipped, ${why}`);
    skip(why);
    return undefined;
  }
  cleanups.push(() => m.close());
  m.systemctl('start', `${UNIT}.service`);
  await waitFor(() => log().includes('"msg":"Listening on'), 'the service to listen', undefined, 30_000);
  return { m, dir, sock, log };
}

/** A RAPL guest's serial console as it steps, read on a timer of its own. */
export interface SteppingGuest {
  serial: GuestSerial;
  /** How many 0x611 lines the guest has printed so far. */
  steps(): number;
  /** Ends the polling, after a last poll. */
  stop(): void;
}

/**
 * Polls `q`'s serial every 20 ms (each line's time is when it appeared, whatever the test awaits) and
 * waits until the guest printed 0x606 and stepped 0x611 up twice; the polling stops through `cleanups` too.
 */
export async function steppingGuest(q: RaplQemu, cleanups: (() => Promise<unknown> | void)[]): Promise<SteppingGuest> {
  const serial = new GuestSerial(q.serialPath);
  const poller = setInterval(() => serial.poll(), 20);
  cleanups.push(() => clearInterval(poller));
  await serial.waitFor(() => serial.first(0x606) !== undefined, 'the guest to print 0x606', 60_000, q);
  const steps = () => serial.energy().length;
  await serial.waitFor(() => steps() >= 3, 'the guest 0x611 to step up twice', 60_000, q);
  return {
    serial,
    steps,
    stop() {
      clearInterval(poller);
      serial.poll();
    },
  };
}
