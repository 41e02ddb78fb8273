/** The `-name` of a VM a v2 client registers (REGISTER carries none), by discovery's rule: both kinds of VM get the same name. */
import path from 'node:path';
import { readProcBytes } from '../os/proc-file.js';
import { guestNameOf, MAX_CMDLINE_BYTES, splitCmdline } from './qemu-cmdline.js';

/** The guest name in a NUL-separated command line, as /proc/<pid>/cmdline; undefined when none is acceptable (guestNameOf). */
export function qemuNameFromCmdline(cmdline: Buffer | string): string | undefined {
  return guestNameOf(splitCmdline(typeof cmdline === 'string' ? Buffer.from(cmdline, 'utf8') : cmdline)) ?? undefined;
}

/** The QEMU guest name of a running process, from its command line; undefined when unknown. */
export function readQemuName(procRoot: string, pid: number): string | undefined {
  const args = readCmdline(procRoot, pid);
  return args === null ? undefined : (guestNameOf(args) ?? undefined);
}

/** A process's arguments (MAX_CMDLINE_BYTES + 1 read: the extra byte tells a cut command line); null when unreadable. */
export function readCmdline(procRoot: string, pid: number): string[] | null {
  try {
    return splitCmdline(readProcBytes(path.join(procRoot, String(pid), 'cmdline'), MAX_CMDLINE_BYTES + 1));
  } catch {
    return null;
  }
}
