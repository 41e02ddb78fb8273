/**
 * Small /proc files read through one reused buffer: they report size 0, so readFileSync reads each into a fresh 64 KiB
 * buffer, and hundreds in a burst (500 VMs registering) leave glibc's heap that many megabytes larger and fragmented.
 */
import fs from 'node:fs';

/** Longest file read: more is an error (a stat line is under 1 KiB, a status file under 2 KiB). */
export const MAX_PROC_FILE_BYTES = 1 << 20;

let buf = Buffer.allocUnsafe(4096);

/** The first `max` bytes of the file (all when shorter), valid until the next read; throws what open/read throw. */
export function readProcBytes(file: string, max: number): Buffer {
  const fd = fs.openSync(file, 'r');
  try {
    let n = 0;
    for (;;) {
      if (n === max) return buf.subarray(0, n);
      if (n === buf.length) {
        const bigger = Buffer.allocUnsafe(Math.min(buf.length * 2, max));
        buf.copy(bigger, 0, 0, n);
        buf = bigger;
      }
      const got = fs.readSync(fd, buf, n, Math.min(buf.length, max) - n, null);
      if (got === 0) return buf.subarray(0, n);
      n += got;
    }
  } finally {
    fs.closeSync(fd);
  }
}

/** The whole file as text; throws what open/read throw, or when it is longer than MAX_PROC_FILE_BYTES. */
export function readProcFile(file: string, encoding: 'latin1' | 'utf8' = 'latin1'): string {
  const b = readProcBytes(file, MAX_PROC_FILE_BYTES + 1);
  if (b.length > MAX_PROC_FILE_BYTES) throw new Error(`${file} is longer than ${MAX_PROC_FILE_BYTES} bytes`);
  return b.toString(encoding);
}

/** readProcFile, or null when the file cannot be read (the process gone, no permission, too long). */
export function readProcFileOr(file: string, encoding: 'latin1' | 'utf8' = 'latin1'): string | null {
  try {
    return readProcFile(file, encoding);
  } catch {
    return null;
  }
}
