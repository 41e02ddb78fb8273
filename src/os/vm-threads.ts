/** A VM given on the command line (--pid, --vcpus), each vCPU checked to be a thread of that pid. */
import path from 'node:path';
import { tidBelongsTo } from './peer.js';
import { readStarttime } from './proc-starttime.js';
import { readProcFileOr } from './proc-file.js';
import type { VcpuSpec } from '../model/vcpus.js';
import type { VmSpec } from '../model/vm.js';

/** Tgid (process id) of a thread, from /proc/<tid>/status; null when it does not exist. */
export function threadGroupOf(procRoot: string, tid: number): number | null {
  const text = readProcFileOr(path.join(procRoot, String(tid), 'status'), 'utf8');
  const m = text === null ? null : /^Tgid:\s*(\d+)$/m.exec(text);
  return m ? Number(m[1]) : null;
}

/** Throws naming the first vCPU tid that is not a thread of pid now, and whose thread it is. */
export function checkThreadsOf(procRoot: string, pid: number, vcpus: readonly VcpuSpec[]): void {
  for (const v of vcpus) {
    if (tidBelongsTo(procRoot, pid, v.tid)) continue;
    const tgid = threadGroupOf(procRoot, v.tid);
    throw new Error(
      tgid === null || tgid === pid ? `thread ${v.tid} does not exist` : `thread ${v.tid} belongs to process ${tgid}, not ${pid}`,
    );
  }
}

/** A VmSpec from --pid and --vcpus: the threads must belong to the pid. */
export function vmSpecFromArgs(procRoot: string, pid: number, vcpus: VcpuSpec[], name?: string): VmSpec {
  if (!Number.isSafeInteger(pid) || pid <= 0) throw new Error(`bad pid ${String(pid)}`);
  const starttime = readStarttime(procRoot, pid);
  if (starttime === null) throw new Error(`process ${pid} does not exist (${path.join(procRoot, String(pid), 'stat')})`);
  checkThreadsOf(procRoot, pid, vcpus);
  return { pid, starttime, vcpus, ...(name !== undefined ? { name } : {}) };
}
