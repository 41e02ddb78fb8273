/**
 * Names that mark a QEMU/KVM process and its vCPU threads, and the stat fields discovery needs. A comm is the process's own
 * (15 bytes, anything in it, spaces and ')' too), so stat fields are counted after the LAST ')'.
 */

/** `CPU <n>/KVM` (or `CPU <n>/TCG` without KVM): QEMU's vCPU thread name with debug-threads=on (libvirt always turns it on). */
const VCPU_RE = /^CPU (\d{1,5})\/(?:KVM|TCG)$/;

/** The vCPU index in a thread name, or null when the name is not a vCPU thread's. */
export function vcpuIndexOf(comm: string): number | null {
  const m = VCPU_RE.exec(comm);
  return m ? Number(m[1]) : null;
}

/** A name QEMU/KVM runs under: qemu-system-<arch> (comm: "qemu-system-x86"), qemu-kvm (RHEL), kvm (Proxmox, Debian's old wrapper). */
export function isQemuName(name: string): boolean {
  return name.startsWith('qemu-system-') || name === 'qemu-kvm' || name === 'kvm';
}

export function baseName(p: string): string {
  const i = p.lastIndexOf('/');
  return i < 0 ? p : p.slice(i + 1);
}

export interface ProcessStat {
  comm: string;
  flags: number;
  numThreads: number;
  /** Field 22, clock ticks after boot. */
  starttime: number;
  /** Field 38: -1 for a thread not its process's main one (CLONE_THREAD): /proc/<tid> resolves, unlisted, and is no process. */
  exitSignal: number;
}

/** PF_KTHREAD: kernel threads are never VMs (and have no command line). */
export const PF_KTHREAD = 0x00200000;

const F_FLAGS = 9 - 3;
const F_NUM_THREADS = 20 - 3;
const F_STARTTIME = 22 - 3;
const F_EXIT_SIGNAL = 38 - 3;

export function parseProcessStat(line: string): ProcessStat | null {
  const open = line.indexOf(' (');
  const close = line.lastIndexOf(')');
  if (open <= 0 || close < open + 1 || line[close + 1] !== ' ') return null;
  const f = line.slice(close + 2).split(' ', F_EXIT_SIGNAL + 1);
  if (f.length <= F_EXIT_SIGNAL) return null;
  const num = (s: string | undefined) => (s !== undefined && /^\d{1,20}$/.test(s) ? Number(s) : NaN);
  const flags = num(f[F_FLAGS]);
  const numThreads = num(f[F_NUM_THREADS]);
  const starttime = num(f[F_STARTTIME]);
  const exitSignal = f[F_EXIT_SIGNAL] === '-1' ? -1 : num(f[F_EXIT_SIGNAL]);
  if (![flags, numThreads, starttime, exitSignal].every(Number.isSafeInteger)) return null;
  return { comm: line.slice(open + 2, close), flags, numThreads, starttime, exitSignal };
}

/** comm of a stat line, or null; cheap (no split), for lines read every interval. */
export function commOf(line: string): string | null {
  const open = line.indexOf(' (');
  const close = line.lastIndexOf(')');
  return open > 0 && close > open ? line.slice(open + 2, close) : null;
}
