/** The starttime of a process (field 22 of /proc/<pid>/stat): with the pid, it names one process. */
import path from 'node:path';
import { parseStatLine } from '../ratio/stat.js';
import { readProcFileOr } from './proc-file.js';

/** Field 22 of /proc/<pid>/stat; null when the process does not exist or the line is unreadable. */
export function readStarttime(procRoot: string, pid: number): number | null {
  if (!Number.isSafeInteger(pid) || pid <= 0) return null;
  const line = readProcFileOr(path.join(procRoot, String(pid), 'stat'));
  if (line === null) return null;
  const st = parseStatLine(line.replace(/\n$/, ''));
  return st.ok ? st.value.starttime : null;
}
