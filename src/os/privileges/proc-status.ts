/** The credential lines of /proc/<pid>/status, and every thread's capabilities read from them. */
import fs from 'node:fs';
import path from 'node:path';

interface ProcStatusCreds {
  uid: number[];
  gid: number[];
  groups: number[];
  capInh: bigint;
  capPrm: bigint;
  capEff: bigint;
  capBnd: bigint;
  capAmb: bigint;
  noNewPrivs: number;
}

/** The credential lines of /proc/<pid>/status (or a task's status). */
export function parseProcStatus(text: string): ProcStatusCreds {
  const field = (name: string): string => {
    const m = new RegExp(`^${name}:[ \\t]*(.*)$`, 'm').exec(text);
    return m?.[1]?.trim() ?? '';
  };
  const nums = (s: string) => (s === '' ? [] : s.split(/\s+/).map(Number));
  const hex = (s: string) => (/^[0-9a-f]+$/i.test(s) ? BigInt(`0x${s}`) : 0n);
  return {
    uid: nums(field('Uid')),
    gid: nums(field('Gid')),
    groups: nums(field('Groups')),
    capInh: hex(field('CapInh')),
    capPrm: hex(field('CapPrm')),
    capEff: hex(field('CapEff')),
    capBnd: hex(field('CapBnd')),
    capAmb: hex(field('CapAmb')),
    noNewPrivs: Number(field('NoNewPrivs') || '0'),
  };
}

export function capHex(v: bigint): string {
  return v.toString(16).padStart(16, '0');
}

/** Every thread's effective capabilities, to log what the per-thread caveat left behind. */
export function describeThreads(procSelf = '/proc/self'): { tid: number; capEff: string; uid: number }[] {
  const out: { tid: number; capEff: string; uid: number }[] = [];
  for (const tid of fs.readdirSync(path.join(procSelf, 'task'))) {
    try {
      const s = parseProcStatus(fs.readFileSync(path.join(procSelf, 'task', tid, 'status'), 'utf8'));
      out.push({ tid: Number(tid), capEff: capHex(s.capEff), uid: s.uid[1] ?? -1 });
    } catch {
      /* thread exited meanwhile */
    }
  }
  return out;
}
