/**
 * The guest name QEMU was started with, from its command line (`-name`): what the daemon knows about
 * a VM a v2 client registers, since REGISTER carries no name.
 */
import fs from 'node:fs';
import path from 'node:path';

/** The longest VM name taken from a command line (libvirt/OpenStack names are far shorter). */
export const MAX_VM_NAME = 256;
/** /proc/<pid>/cmdline is read up to this much: the -name of a QEMU is near the start. */
const MAX_CMDLINE_BYTES = 64 * 1024;

/**
 * The guest name in a QEMU command line (NUL-separated, as /proc/<pid>/cmdline): `-name NAME`,
 * `-name guest=NAME,debug-threads=on` (libvirt) or `--name ...`; QEMU writes a comma in a name as ",,".
 * undefined when there is none, or it is empty, too long (MAX_VM_NAME) or holds control characters:
 * another process's command line is not trusted.
 */
export function qemuNameFromCmdline(cmdline: Buffer | string): string | undefined {
  const args = (typeof cmdline === 'string' ? cmdline : cmdline.toString('utf8')).split('\0');
  const i = args.findIndex((a) => a === '-name' || a === '--name');
  const value = i >= 0 ? args[i + 1] : undefined;
  if (value === undefined) return undefined;
  // Options split at single commas; ",," is a literal comma.
  const opts = value.split(/(?<!,),(?!,)/).map((o) => o.replace(/,,/g, ','));
  const guest = opts.find((o) => o.startsWith('guest='))?.slice('guest='.length) ?? (opts[0]!.includes('=') ? undefined : opts[0]);
  if (guest === undefined || guest === '' || guest.length > MAX_VM_NAME || /[\u0000-\u001f\u007f-\u009f]/.test(guest)) return undefined;
  return guest;
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
