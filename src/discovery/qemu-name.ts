/**
 * The guest name QEMU was started with, from its command line (`-name`): what the daemon knows about
 * a VM a v2 client registers, since REGISTER carries no name. The parsing rule is discovery's
 * (qemu-cmdline.ts guestNameOf), so a registered and a discovered VM get the same name.
 */
import fs from 'node:fs';
import path from 'node:path';
import { guestNameOf, MAX_CMDLINE_BYTES, splitCmdline } from './qemu-cmdline.js';

/**
 * The guest name in a QEMU command line (NUL-separated, as /proc/<pid>/cmdline); undefined when there
 * is none or it is not acceptable (see guestNameOf): another process's command line is not trusted.
 */
export function qemuNameFromCmdline(cmdline: Buffer | string): string | undefined {
  return guestNameOf(splitCmdline(typeof cmdline === 'string' ? Buffer.from(cmdline, 'utf8') : cmdline)) ?? undefined;
}

/** The QEMU guest name of a running process, from its command line; undefined when unknown. */
export function readQemuName(procRoot: string, pid: number): string | undefined {
  let fd: number | undefined;
  try {
    fd = fs.openSync(path.join(procRoot, String(pid), 'cmdline'), 'r');
    const buf = Buffer.alloc(MAX_CMDLINE_BYTES);
    const n = fs.readSync(fd, buf, 0, buf.length, 0);
    return qemuNameFromCmdline(buf.subarray(0, n));
  } catch {
    return undefined;
  } finally {
    if (fd !== undefined) fs.closeSync(fd);
  }
}
