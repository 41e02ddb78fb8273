/** A VM as QEMU describes it over QMP: its vCPU threads, their virtual package, its name. */
import { QmpClient } from './qmp.js';
import { checkThreadsOf } from '../os/vm-threads.js';
import { readStarttime } from '../os/proc-starttime.js';
import { type VcpuSpec, checkVcpus } from '../model/vcpus.js';
import type { VmSpec } from '../model/vm.js';

/** vCPU threads (socket-id as vpkg) and name from QMP; the pid from SO_PEERCRED, refused unless it is the vCPUs' Tgid. */
export async function vmSpecFromQmp(socketPath: string, procRoot: string): Promise<VmSpec> {
  const qmp = await QmpClient.connect(socketPath);
  try {
    const pid = qmp.peerCredentials().pid;
    const cpus = await qmp.queryCpus();
    const name = await qmp.queryName();
    // Without socket-id (boards that give no props) every vCPU is in virtual package 0.
    const listed = checkVcpus(cpus.map((c): VcpuSpec => ({ tid: c.threadId, vpkg: c.socketId ?? 0 })));
    if (!listed.ok) throw new Error(`QMP ${socketPath}: query-cpus-fast: ${listed.error}`);
    const vcpus = listed.value;
    try {
      checkThreadsOf(procRoot, pid, vcpus);
    } catch (e) {
      throw new Error(`QMP ${socketPath}: the socket's owner (pid ${pid}) is not the QEMU running these vCPUs: ${(e as Error).message}`);
    }
    const starttime = readStarttime(procRoot, pid);
    if (starttime === null) throw new Error(`QMP ${socketPath}: QEMU process ${pid} vanished`);
    return { pid, starttime, vcpus, ...(name !== undefined ? { name } : {}) };
  } finally {
    qmp.close();
  }
}
