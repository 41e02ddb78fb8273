/**
 * Reading a small /proc file as text, through one reused buffer: /proc files report size 0, so
 * fs.readFileSync reads each into a fresh 64 KiB buffer, and hundreds in a burst (500 VMs
 * registering) leave glibc's heap that many megabytes larger and fragmented.
 */
import fs from 'node:fs';

/** Longest file read: more is an error (a stat line is under 1 KiB, a status file under 2 KiB). */
export const MAX_PROC_FILE_BYTES = 1 << 20;

let buf = Buffer.allocUnsafe(4096);

/** The whole file as text; throws what open/read throw, or when it is longer than MAX_PROC_FILE_BYTES. */
export function readProcFile(file: string, encoding: 'latin1' | 'utf8' = 'latin1'): string {
  const fd = fs.openSync(file, 'r');
  try {
    let n = 0;
    for (;;) {
      if (n === buf.length) {
        if (buf.length >= MAX_PROC_FILE_BYTES) throw new Error(`${file} is longer than ${MAX_PROC_FILE_BYTES} bytes`);
        const bigger = Buffer.allocUnsafe(buf.length * 2);
        buf.copy(bigger, 0, 0, n);
        buf = bigger;
      }
      const got = fs.readSync(fd, buf, n, buf.length - n, null);
      if (got === 0) return buf.toString(encoding, 0, n);
      n += got;
    }
  } finally {
    fs.closeSync(fd);
  }
}

/** readProcFile, or null when the file cannot be read (the process gone, no permission, too long). */
export function readProcFileOr(file: string, encoding: 'latin1' | 'utf8' = 'latin1'): string | null {
  try {
    return readProcFile(file, encoding);
  } catch {
    return null;
  }
}
