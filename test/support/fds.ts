/** File descriptors of this process, as tests look at them. */
import fs from 'node:fs';

/** Whether `fd` is open in this process (fstat succeeds on it). */
export function isOpen(fd: number): boolean {
  try {
    fs.fstatSync(fd);
    return true;
  } catch {
    return false;
  }
}
