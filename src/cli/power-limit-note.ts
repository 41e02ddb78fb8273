/**
 * A VM's power limit as `stats` and `watch` show it (docs/power-limits.md "Seen from outside"), read
 * from its statistics file (`power_limit`, `power_limit_cpu_quota`, `power_limited_time`): the limit,
 * whether the helper's quota holds the VM now (throttled) or the VM stays under it (ok), the quota and
 * the time limited.
 */
import type { StatsReader, StatsSample } from '../client/stats-reader.js';

export interface PowerLimitNote {
  limitW: number;
  /** CPUs of bandwidth the helper's quota gives the VM now; 0: no quota in force (the VM is under its limit). */
  quotaCpus: number;
  limitedS: number;
}

/** The VM's limit from its file, or null (no limit, or a file without the values). */
export function powerLimitOf(r: StatsReader, s: StatsSample): PowerLimitNote | null {
  const limit = r.value(s, 'power_limit');
  if (limit === undefined || limit === 0n) return null;
  return {
    // Divided, not multiplied by the scale: 24900 mW is 24.9 W, not 24.900000000000002.
    limitW: Number(limit) / Math.round(1 / r.scale('power_limit')),
    quotaCpus: Number(r.value(s, 'power_limit_cpu_quota') ?? 0n) * r.scale('power_limit_cpu_quota'),
    limitedS: Number(r.value(s, 'power_limited_time') ?? 0n) * r.scale('power_limited_time'),
  };
}

/** ", limit 21.5 W throttled (quota 0.48 CPU, 33 s limited)" or ", limit 30 W ok"; '' without a limit. */
export function powerLimitNote(n: PowerLimitNote | null, lead = ', '): string {
  if (n === null) return '';
  const state = n.quotaCpus > 0 ? `throttled (quota ${n.quotaCpus.toFixed(2)} CPU, ${n.limitedS.toFixed(0)} s limited)` : 'ok';
  return `${lead}limit ${n.limitW} W ${state}`;
}

/** The --json fields: power_limit_w, power_limit_state ("throttled" or "ok"), power_limit_cpu_quota, power_limited_s; none without a limit. */
export function powerLimitJson(n: PowerLimitNote | null): Record<string, number | string> {
  return n === null
    ? {}
    : {
        power_limit_w: n.limitW,
        power_limit_state: n.quotaCpus > 0 ? 'throttled' : 'ok',
        power_limit_cpu_quota: n.quotaCpus,
        power_limited_s: n.limitedS,
      };
}
