import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { isHelperProcess } from '../../src/helper/lifecycle/pidfile.js';

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-pidfile-'));
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

/** A fake /proc/<pid>/cmdline (NUL-separated, as the kernel writes it). */
function proc(pid: number, argv: string[]): void {
  fs.mkdirSync(path.join(tmp, String(pid)), { recursive: true });
  fs.writeFileSync(path.join(tmp, String(pid), 'cmdline'), argv.join('\0') + '\0');
}

describe('isHelperProcess', () => {
  it('is true for node running the script, the npm bin and qemu-vmsr-helper; false for anything else', () => {
    proc(1, ['/usr/bin/node', '/opt/vmsr-helper/dist/src/bin/vmsr-helper.js', '-k', '/run/x.sock']);
    proc(2, ['node', '/usr/local/bin/vmsr-helper']);
    proc(3, ['/usr/bin/qemu-vmsr-helper', '-k', '/run/x.sock']);
    proc(4, ['sleep', '30']);
    proc(5, ['/usr/bin/python3', 'x.py', 'vmsr-helper']); // named only as a later argument
    proc(6, ['node', '/tmp/not-vmsr-helper.js']);
    proc(8, [
      '/usr/bin/node',
      '--max-semi-space-size=4',
      '--v8-pool-size=1',
      '/opt/vmsr-helper/dist/src/bin/vmsr-helper.js',
      '-k',
      '/run/x.sock',
    ]); // the re-executed daemon
    expect([1, 2, 3, 4, 5, 6, 7, 8].map((p) => isHelperProcess(p, tmp))).toEqual([true, true, true, false, false, false, false, true]);
  });
});
