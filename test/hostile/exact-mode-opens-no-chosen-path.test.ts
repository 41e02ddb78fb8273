/**
 * Exact mode once opened whatever path a process put in its argv[0], as the helper's
 * user, to read QEMU's version: a device (a watchdog arms when opened) or a FIFO (its blocked writer
 * goes on). Here a fake QEMU of the helper's uid, not dumpable (its /proc/<pid>/exe closed to the helper), names a FIFO
 * as its argv[0], and a writer waits on that FIFO: the real daemon (-u nobody) decides the VM's
 * version without waking it, and answers it raw.
 */
import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, expect, test } from 'vitest';
import { NOBODY, notRoot, onCleanup, said, startExactDaemon } from './support.js';
import { VmsrFakeQemu } from '../support/vmsr-fake-qemu.js';
import { PYTHON } from '../support/fake-qemu.js';

const why = notRoot();

describe.skipIf(why !== null)("exact mode and a peer's argv[0]", () => {
  if (why !== null) console.log(`skipped: ${why}`);

  test('a FIFO named by a peer as its argv[0] is never opened to read its version', async () => {
    const { daemon, sock, dir, exe } = await startExactDaemon();
    const fifoDir = path.join(dir, 'bin');
    fs.mkdirSync(fifoDir, { mode: 0o755 });
    const fifo = path.join(fifoDir, 'qemu-system-x86_64');
    execFileSync('mkfifo', ['-m', '0666', fifo]);
    // The writer's open returns only once someone opens the FIFO to read.
    const writer = spawn(PYTHON, ['-c', `open(${JSON.stringify(fifo)}, "w"); print("opened", flush=True)`], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    onCleanup(() => void writer.kill('SIGKILL'));
    let woke = false;
    writer.stdout.on('data', () => (woke = true));
    const q = new VmsrFakeQemu({
      exe,
      socket: sock,
      logDir: dir,
      sockets: 1,
      perSocket: 1,
      vcpus: 1,
      uid: NOBODY,
      argv0: fifo,
      undumpable: true,
    });
    onCleanup(() => q.kill());
    await q.ready();
    await q.cmd('spin 0');
    // Waited for: the helper's verdict on the VM's version (raw), then 3 more windows.
    await said(daemon, 'guest energy: raw for this VM', 1, 40_000).catch((e: Error) => {
      console.log(q.windows().length, daemon.stderr().slice(-3000));
      throw e;
    });
    await q.windowsClosed(q.windows().length + 3);
    expect(woke, 'the FIFO was opened by the helper').toBe(false);
    expect(daemon.stderr()).not.toContain('exact for this VM from this window on');
  }, 300_000);
});
