/**
 * A guest directory opened as the publisher opens it, for the writer's tests. It imports nothing that
 * loads src/guest-dir/safe-dir.ts: a test may set the writer's environment before it imports SafeDir.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { SafeDir } from '../../src/guest-dir/safe-dir.js';
import { O_DIRECTORY, O_RDONLY, openAt } from '../../src/os/libc/dir-fd.js';
import { closeFd } from '../../src/os/libc/fds.js';

/**
 * A guest directory `vm` in a new DIR on tmpfs (where the host puts it), opened with `open`
 * (SafeDir.open), and the path of `zone`'s energy_uj in it; `cleanups` gets its closing and removal.
 */
export function openGuestTree(open: (typeof SafeDir)['open'], zone: string, cleanups: (() => unknown)[]): { dir: SafeDir; file: string } {
  const shm = fs.existsSync('/dev/shm') ? '/dev/shm' : os.tmpdir();
  const root = fs.mkdtempSync(path.join(shm, 'vmsr-safe-dir-'));
  fs.mkdirSync(path.join(root, 'vm'));
  const rootFd = openAt(-100, root, O_RDONLY | O_DIRECTORY);
  const opened = open(rootFd, root, 'vm', [process.geteuid?.() ?? 0]);
  if (!opened.ok) throw new Error(`cannot open the test's guest directory: ${opened.error}`);
  cleanups.push(() => {
    opened.value.close();
    closeFd(rootFd);
    fs.rmSync(root, { recursive: true, force: true });
  });
  return { dir: opened.value, file: path.join(root, 'vm', zone, 'energy_uj') };
}
