/**
 * A VM's threads as QEMU's vmsr thread reads them at a window's edge: /proc/<pid>/task listed, each
 * thread's stat read (utime + stime, starttime, the CPU it last ran on, as its package). The main
 * thread is left out, as QEMU leaves it out. A thread that is gone, or whose line does not parse, is
 * absent; a process with more than `maxThreads` threads gives null (exact mode then answers raw).
 */
import fs from 'node:fs';
import { readProcFile } from '../../os/proc-file.js';
import { parseStatLine } from '../../ratio/stat.js';
import type { ThreadRead, ThreadSnapshot } from '../../guest-energy/thread-snapshot.js';

export function readThreads(
  procRoot: string,
  pid: number,
  pkgOfCpu: ReadonlyMap<number, number>,
  maxThreads: number,
): ThreadSnapshot | null {
  let tids: string[];
  try {
    tids = fs.readdirSync(`${procRoot}/${pid}/task`);
  } catch {
    return null;
  }
  if (tids.length > maxThreads) return null;
  const out = new Map<number, ThreadRead>();
  for (const name of tids) {
    const tid = Number(name);
    if (!Number.isSafeInteger(tid) || tid === pid) continue;
    let line: string;
    try {
      line = readProcFile(`${procRoot}/${pid}/task/${name}/stat`);
    } catch {
      continue;
    }
    const st = parseStatLine(line.trimEnd());
    if (!st.ok || st.value.tid !== tid) continue;
    const v = st.value;
    out.set(tid, { tid, ticks: v.utime + v.stime, starttime: v.starttime, pkg: pkgOfCpu.get(v.processor) ?? -1 });
  }
  return out;
}
