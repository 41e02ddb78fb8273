/**
 * A VM's CPU bandwidth as the power limiter sees it (docs/power-limits.md "The mechanism"): the
 * interface the limiter drives, so the loop runs without cgroups in tests, and the two cgroup file
 * formats behind it, pure: v1's `cpu.cfs_quota_us` ("-1" or µs; the period in `cpu.cfs_period_us`)
 * and v2's `cpu.max` ("max 100000" or "50000 100000").
 */
import type { HeldGroupState } from '../state/snapshot.js';

/** The bandwidth of one VM's vCPU threads, across the cgroups that hold them. */
export interface VmBandwidth {
  /** The cgroups, for logs: each one's path under its hierarchy. */
  readonly groups: readonly string[];
  /**
   * Sets `cpus` CPUs of bandwidth for the VM, split over its groups by their vCPUs; a group's quota set
   * by someone else is never raised (the lower of the two is written). Returns the µs per period in
   * force in all, and the period.
   */
  set(cpus: number): { quotaUs: number; periodUs: number };
  /** Gives every group back the quota it had, byte for byte, and every moved thread its group; idempotent. */
  release(): void;
  /** What a restart or a crash carries of each group (the checkpoint): the next process goes on from it. */
  state(): HeldGroupState[];
}

/**
 * Opens a VM's bandwidth from its vCPU threads; throws a "cannot" error saying why and the fix.
 * `carried`: the groups a previous process held (its checkpoint), taken over with the bytes they held
 * before it: a group found again from /proc whose path is one of them is adopted, not opened anew.
 */
export type BandwidthOpener = (pid: number, vcpuTids: readonly number[], carried?: readonly HeldGroupState[]) => VmBandwidth;

export type CgroupVersion = 1 | 2;

/** A group's quota as its file says: µs per period (null: none) and the period. */
export interface Quota {
  quotaUs: number | null;
  periodUs: number;
}

/** The file that holds a group's quota. */
export function quotaFile(v: CgroupVersion): string {
  return v === 1 ? 'cpu.cfs_quota_us' : 'cpu.max';
}

/** A quota file's text (v1: with the period read from cpu.cfs_period_us); null when it is not one. */
export function parseQuota(v: CgroupVersion, text: string, v1PeriodText = '100000'): Quota | null {
  const num = (s: string | undefined) => (s !== undefined && /^\d{1,12}$/.test(s) ? Number(s) : null);
  if (v === 1) {
    const t = text.trim();
    const periodUs = num(v1PeriodText.trim());
    if (periodUs === null || periodUs === 0) return null;
    if (/^-\d+$/.test(t)) return { quotaUs: null, periodUs };
    const q = num(t);
    return q === null ? null : { quotaUs: q, periodUs };
  }
  const [q, p, extra] = text.trim().split(' ');
  const periodUs = num(p);
  if (extra !== undefined || periodUs === null || periodUs === 0) return null;
  if (q === 'max') return { quotaUs: null, periodUs };
  const quotaUs = num(q);
  return quotaUs === null ? null : { quotaUs, periodUs };
}

/** The text that sets a quota of `quotaUs` (the kernel's least is 1000 µs). */
export function formatQuota(v: CgroupVersion, quotaUs: number, periodUs: number): string {
  const q = Math.max(1000, Math.round(quotaUs));
  return v === 1 ? `${q}\n` : `${q} ${periodUs}\n`;
}

/** A group's share of `cpus` CPUs, in µs per period: its vCPUs' part, never above `theirs`. */
export function groupQuotaUs(cpus: number, groupVcpus: number, nvcpu: number, q: Quota): number {
  const ours = Math.max(1000, Math.round(((cpus * groupVcpus) / Math.max(1, nvcpu)) * q.periodUs));
  return q.quotaUs === null ? ours : Math.min(ours, q.quotaUs);
}
