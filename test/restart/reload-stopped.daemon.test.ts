/**
 * `vmsr-helper reload` stopped while it waits for the restart (a caller's timeout, Ctrl-C) ended
 * without a word: a test's 30 s timeout killed it under load and read "exit 1, empty stderr", and a
 * user could not tell whether the helper had been signalled. Now it says what it waited for, since
 * when, and that the helper goes on with the restart, and exits 128 + the signal's number.
 *
 * The wait is made to last with real parts: the daemon is started through a link to the binary, and
 * once it serves the link is pointed at a script that hangs, so the restart's check of the installed
 * binary (`--version`) takes until its own bound; the reload waits for the restart to begin meanwhile.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { FakeHost } from '../support/fake-host.js';
import { BIN, hostArgs, spawnHelper, startHelper, tempDir, waitFor } from '../daemon/support/daemon-process.js';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** A `--version` that never answers; it ends once the daemon that ran it (pid `daemon`) is gone, and after 2 min. */
const hungBinary = (daemon: number) =>
  `setInterval(() => process.ppid !== ${daemon} && process.exit(1), 100); setTimeout(() => process.exit(1), 120000);\n`;

describe('a reload stopped while it waits', () => {
  for (const signal of ['SIGTERM', 'SIGINT'] as const)
    test(`vmsr-helper reload says what it waited for and exits 128 + the signal when ${signal} stops it before the restart began`, async () => {
      const host = new FakeHost();
      host.writePackageMsr(0, 0x606, 0xa1003n);
      host.writePackageMsr(0, 0x611, 0x1000n);
      const dir = tempDir('vmsr-reload-stopped-');
      cleanups.push(() => (host.cleanup(), fs.rmSync(dir, { recursive: true, force: true })));
      const sock = path.join(dir, 'h.sock');
      const installed = path.join(dir, 'vmsr-helper.js');
      fs.symlinkSync(BIN, installed);
      const helper = await startHelper(['-k', sock, ...hostArgs(host)], { command: [process.execPath, installed] });
      cleanups.push(() => helper.stop('SIGKILL'));
      fs.rmSync(installed);
      fs.writeFileSync(installed, hungBinary(helper.proc.pid!));

      const reload = spawnHelper(['reload', '-k', sock]);
      cleanups.push(() => reload.stop('SIGKILL'));
      await waitFor(
        () => helper.stderr().includes('restart in place: checking the installed binary'),
        "the reload's SIGHUP taken",
        reload,
        60_000,
      );
      reload.proc.kill(signal);
      const code = await reload.exited;
      expect(code, reload.stderr()).toBe(128 + os.constants.signals[signal]);
      expect(reload.stderr()).toMatch(
        new RegExp(
          `^vmsr-helper reload: cannot reload: stopped by ${signal} while waiting for the helper \\(pid ${helper.proc.pid}\\) to begin the restart, \\d+\\.\\d s after its SIGHUP; the helper goes on with the restart: its log says how it ended, and vmsr-helper stats --once -k ${sock} whether it serves\\n$`,
        ),
      );
    });
});
