/**
 * The real daemon (dist/) on a fake host whose package 0 counts (energy pumped every 20 ms), its socket
 * open to every user (mode 0666, its folder searchable), for tests whose client runs as another uid.
 */
import fs from 'node:fs';
import path from 'node:path';
import { FakeHost } from '../../support/fake-host.js';
import { hostArgs, spawnHelper, tempDir, waitFor, type DaemonChild } from './daemon-process.js';

export interface OpenDaemonOptions {
  /** Package of each CPU of the fake host (default one CPU in package 0). */
  packages?: number[];
  /** Energy units added every 20 ms. */
  units: number;
  /** Daemon options after the host's and the socket's. */
  extra?: string[];
  /** Registers what the caller's afterEach undoes, in reverse. */
  onCleanup: (c: () => unknown) => void;
}

export async function startOpenDaemon(o: OpenDaemonOptions): Promise<{ sock: string; fake: FakeHost; dir: string; helper: DaemonChild }> {
  const fake = new FakeHost(o.packages ? { packages: o.packages } : {});
  const stop = fake.pumpEnergy({ pkg: 0, start: 0x1000, units: o.units, everyMs: 20 });
  o.onCleanup(() => fake.cleanup());
  o.onCleanup(stop);
  const dir = tempDir('vmsr-open-');
  fs.chmodSync(dir, 0o755);
  o.onCleanup(() => fs.rmSync(dir, { recursive: true, force: true }));
  const sock = path.join(dir, 'helper.sock');
  const helper = spawnHelper(['-k', sock, ...hostArgs(fake), '--interval', '0.2', '--socket-mode', '0666', ...(o.extra ?? [])]);
  o.onCleanup(() => helper.stop('SIGKILL'));
  await waitFor(() => helper.stderr().includes('"msg":"Listening on'), 'the helper to listen', helper);
  return { sock, fake, dir, helper };
}
