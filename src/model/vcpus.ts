/** THE vCPU-list rule for every way a VM arrives; `allowEmpty` is the engine's (a discovered VM may lack vCPU threads a while). */
import { fail, ok, type Result } from '../common/result.js';

/** vCPUs one VM may have, and the highest virtual package: the v2 protocol's bounds, used everywhere. */
export const MAX_VCPUS = 4096;
/** Threads of one VM whose fds are kept, by default (--max-vm-threads): the most vCPUs, and room for QEMU's other threads. */
export const DEFAULT_MAX_VM_THREADS = MAX_VCPUS + 512;
export const MAX_VPKG = 255;

/** Highest process or thread id accepted anywhere (pid_t is a signed 32-bit int; Linux's own limit is 2^22). */
export const MAX_TID = 0x7fffffff;

export interface VcpuSpec {
  tid: number;
  /** Virtual package (socket) of this vCPU in the guest, 0..255. */
  vpkg: number;
}

/** Checks a vCPU list; on success the value is a copy holding only tid and vpkg. */
export function checkVcpus(vcpus: readonly VcpuSpec[], opts: { allowEmpty?: boolean } = {}): Result<VcpuSpec[]> {
  if (vcpus.length === 0 && opts.allowEmpty !== true) return fail('the vCPU list is empty: a VM has at least one vCPU');
  if (vcpus.length > MAX_VCPUS) return fail(`the vCPU list has ${vcpus.length} entries, at most ${MAX_VCPUS}`);
  const seen = new Set<number>();
  const out: VcpuSpec[] = [];
  for (let i = 0; i < vcpus.length; i++) {
    const { tid, vpkg } = vcpus[i]!;
    if (!Number.isInteger(tid) || tid < 1 || tid > MAX_TID) return fail(`vCPU ${i + 1}: thread id ${tid} is out of range (1..${MAX_TID})`);
    if (!Number.isInteger(vpkg) || vpkg < 0 || vpkg > MAX_VPKG)
      return fail(`vCPU ${i + 1}: virtual package ${vpkg} is out of range (0..${MAX_VPKG})`);
    if (seen.has(tid)) return fail(`vCPU ${i + 1}: thread ${tid} is listed twice`);
    seen.add(tid);
    out.push({ tid, vpkg });
  }
  return ok(out);
}

/** checkVcpus for callers that throw: the message is the rule's own. */
export function validVcpus(vcpus: readonly VcpuSpec[], opts?: Parameters<typeof checkVcpus>[1]): VcpuSpec[] {
  const r = checkVcpus(vcpus, opts);
  if (!r.ok) throw new Error(r.error);
  return r.value;
}

/** Parses "TID:VPKG,TID:VPKG,..." (the --vcpus syntax), then applies checkVcpus. */
export function parseVcpuList(text: string): VcpuSpec[] {
  if (typeof text !== 'string' || text.trim() === '')
    throw new Error('the vCPU list is empty: expected TID:VPKG[,TID:VPKG...], e.g. 4250:0,4251:1');
  const parts = text.trim().split(',');
  if (parts.length > MAX_VCPUS) throw new Error(`the vCPU list has ${parts.length} entries, at most ${MAX_VCPUS}`);
  const vcpus = parts.map((part, i) => {
    const m = /^\s*(\d{1,10}):(\d{1,3})\s*$/.exec(part);
    if (!m) throw new Error(`vCPU ${i + 1} ${JSON.stringify(part.slice(0, 40))}: expected TID:VPKG, e.g. 4250:0`);
    return { tid: Number(m[1]), vpkg: Number(m[2]) };
  });
  return validVcpus(vcpus);
}
