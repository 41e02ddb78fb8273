/**
 * A VM to register: its pid, the starttime that identifies that process, and its vCPU threads with
 * their virtual package, either given on the command line or asked from QEMU over QMP.
 */
import fs from 'node:fs';
import path from 'node:path';
import { QmpClient, type QmpConnectOptions } from '../client/qmp.js';
import { tidBelongsTo } from '../helper/peer.js';
import { isStatParseError, parseStatLine } from './stat.js';
import { MAX_VCPUS, MAX_VPKG, type VcpuSpec, type VmSpec } from './types.js';


/** Field 22 of /proc/<pid>/stat; null when the process does not exist or the line is unreadable. */
export function readStarttime(procRoot: string, pid: number): number | null {
  if (!Number.isSafeInteger(pid) || pid <= 0) return null;
  let line: string;
  try {
    line = fs.readFileSync(path.join(procRoot, String(pid), 'stat'), 'latin1');
  } catch {
    return null;
  }
  const st = parseStatLine(line.replace(/\n$/, ''));
  return isStatParseError(st) ? null : st.starttime;
}

/** Parses "TID:VPKG,TID:VPKG,...": positive tids, vpkg 0..255, no tid twice, 1..4096 entries. */
export function parseVcpuList(text: string): VcpuSpec[] {
  if (typeof text !== 'string' || text.trim() === '') throw new Error('vCPU list is empty: expected TID:VPKG[,TID:VPKG...], e.g. 4250:0,4251:1');
  const parts = text.trim().split(',');
  if (parts.length > MAX_VCPUS) throw new Error(`vCPU list has ${parts.length} entries, at most ${MAX_VCPUS}`);
  const seen = new Set<number>();
  return parts.map((part, i) => {
    const m = /^\s*(\d{1,10}):(\d{1,3})\s*$/.exec(part);
    if (!m) throw new Error(`vCPU list entry ${i + 1} ${JSON.stringify(part.slice(0, 40))}: expected TID:VPKG, e.g. 4250:0`);
    const tid = Number(m[1]);
    const vpkg = Number(m[2]);
    if (tid <= 0 || tid > 0x7fffffff) throw new Error(`vCPU list entry ${i + 1}: thread id ${m[1]} out of range`);
    if (vpkg > MAX_VPKG) throw new Error(`vCPU list entry ${i + 1}: virtual package ${vpkg} out of range (0..${MAX_VPKG})`);
    if (seen.has(tid)) throw new Error(`vCPU list entry ${i + 1}: thread ${tid} listed twice`);
    seen.add(tid);
    return { tid, vpkg };
  });
}

/** Tgid (process id) of a thread, from /proc/<tid>/status; null when it does not exist. */
export function threadGroupOf(procRoot: string, tid: number): number | null {
  let text: string;
  try {
    text = fs.readFileSync(path.join(procRoot, String(tid), 'status'), 'utf8');
  } catch {
    return null;
  }
  const m = /^Tgid:\s*(\d+)$/m.exec(text);
  return m ? Number(m[1]) : null;
}

/**
 * Checks that every vCPU tid is a thread of pid, now, by the rule the daemon applies to its clients
 * (tidBelongsTo); throws naming the first that is not, and whose thread it is.
 */
export function checkThreadsOf(procRoot: string, pid: number, vcpus: readonly VcpuSpec[]): void {
  for (const v of vcpus) {
    if (tidBelongsTo(procRoot, pid, v.tid)) continue;
    const tgid = threadGroupOf(procRoot, v.tid);
    throw new Error(tgid === null || tgid === pid ? `thread ${v.tid} does not exist` : `thread ${v.tid} belongs to process ${tgid}, not ${pid}`);
  }
}

/** A VmSpec from --pid and --vcpus: the threads must belong to the pid. */
export function vmSpecFromArgs(procRoot: string, pid: number, vcpus: VcpuSpec[], name?: string): VmSpec {
  if (!Number.isSafeInteger(pid) || pid <= 0) throw new Error(`bad pid ${String(pid)}`);
  const starttime = readStarttime(procRoot, pid);
  if (starttime === null) throw new Error(`process ${pid} does not exist (${path.join(procRoot, String(pid), 'stat')})`);
  checkThreadsOf(procRoot, pid, vcpus);
  const spec: VmSpec = { pid, starttime, vcpus };
  if (name !== undefined) spec.name = name;
  return spec;
}

/**
 * Asks QEMU over QMP: vCPU threads (query-cpus-fast thread-id, socket-id as vpkg), name (query-name),
 * and the QEMU pid from SO_PEERCRED of the monitor socket, checked against each vCPU thread's Tgid so a
 * socket served by anything but that QEMU is refused.
 */
export async function vmSpecFromQmp(socketPath: string, procRoot: string, o: QmpConnectOptions = {}): Promise<VmSpec> {
  const qmp = await QmpClient.connect(socketPath, o);
  try {
    const pid = qmp.peerCredentials().pid;
    const cpus = await qmp.queryCpus();
    const name = await qmp.queryName();
    if (cpus.length === 0) throw new Error(`QMP ${socketPath}: query-cpus-fast lists no vCPU`);
    if (cpus.length > MAX_VCPUS) throw new Error(`QMP ${socketPath}: ${cpus.length} vCPUs, at most ${MAX_VCPUS}`);
    const vcpus: VcpuSpec[] = cpus.map((c) => {
      // Without socket-id (boards that give no props) every vCPU is in virtual package 0.
      const vpkg = c.socketId ?? 0;
      if (vpkg > MAX_VPKG) throw new Error(`QMP ${socketPath}: vCPU ${c.cpuIndex} has socket-id ${vpkg}, at most ${MAX_VPKG}`);
      return { tid: c.threadId, vpkg };
    });
    try {
      checkThreadsOf(procRoot, pid, vcpus);
    } catch (e) {
      throw new Error(`QMP ${socketPath}: the socket's owner (pid ${pid}) is not the QEMU running these vCPUs: ${(e as Error).message}`);
    }
    const starttime = readStarttime(procRoot, pid);
    if (starttime === null) throw new Error(`QMP ${socketPath}: QEMU process ${pid} vanished`);
    const spec: VmSpec = { pid, starttime, vcpus };
    if (name !== undefined) spec.name = name;
    return spec;
  } finally {
    qmp.close();
  }
}
