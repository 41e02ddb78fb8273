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

/** Whether `fd` is close-on-exec: O_CLOEXEC (02000000) in the flags of /proc/self/fdinfo/<fd>. */
export function isCloseOnExec(fd: number): boolean {
  const flags = /^flags:\s*([0-7]+)$/m.exec(fs.readFileSync(`/proc/self/fdinfo/${fd}`, 'utf8'));
  if (!flags) throw new Error(`no flags in /proc/self/fdinfo/${fd}`);
  return (parseInt(flags[1]!, 8) & 0o2000000) !== 0;
}
