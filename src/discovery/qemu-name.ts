/**
 * The guest name QEMU was started with (`-name`), for a VM a v2 client registers (REGISTER carries no
 * name), by discovery's rule (guestNameOf), so a registered and a discovered VM get the same name.
 */
import fs from 'node:fs';
import path from 'node:path';
import { guestNameOf, MAX_CMDLINE_BYTES, splitCmdline } from './qemu-cmdline.js';

/** The guest name in a NUL-separated command line, as /proc/<pid>/cmdline; undefined when none is acceptable (guestNameOf). */
export function qemuNameFromCmdline(cmdline: Buffer | string): string | undefined {
  return guestNameOf(splitCmdline(typeof cmdline === 'string' ? Buffer.from(cmdline, 'utf8') : cmdline)) ?? undefined;
}

/** The QEMU guest name of a running process, from its command line; undefined when unknown. */
export function readQemuName(procRoot: string, pid: number): string | undefined {
  const args = readCmdline(procRoot, pid, Buffer.alloc(MAX_CMDLINE_BYTES + 1));
  return args === null ? undefined : (guestNameOf(args) ?? undefined);
}

/** A process's arguments, read into `buf` (MAX_CMDLINE_BYTES + 1 bytes: the extra one tells a cut command line); null when unreadable. */
export function readCmdline(procRoot: string, pid: number, buf: Buffer): string[] | null {
  let fd: number;
  try {
    fd = fs.openSync(path.join(procRoot, String(pid), 'cmdline'), 'r');
  } catch {
    return null;
  }
  try {
    let n = 0;
    while (n < buf.length) {
      const got = fs.readSync(fd, buf, n, buf.length - n, null);
      if (got <= 0) break;
      n += got;
    }
    return splitCmdline(buf.subarray(0, n));
  } catch {
    return null;
  } finally {
    fs.closeSync(fd);
  }
}
