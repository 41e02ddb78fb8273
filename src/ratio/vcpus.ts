/** The vCPU list of a VM: which threads, in which virtual package. */
import { MAX_VCPUS, MAX_VPKG, type VcpuSpec } from './types.js';

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
