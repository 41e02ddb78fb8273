/**
 * A VM's power limit as `stats` and `watch` show it, from its statistics file (docs/power-limits.md
 * "Seen from outside"): each domain's limit, whether the quota holds the VM now, the quota and the
 * time limited.
 */
import type { StatsReader, StatsSample } from '../client/stats-reader.js';
import { ENERGY_DOMAINS, type EnergyDomain } from '../model/domains.js';

export interface PowerLimitNote {
  /** Each domain's limit, in ENERGY_DOMAINS order (at least one). */
  limits: { domain: EnergyDomain; limitW: number }[];
  /** CPUs of bandwidth the helper's quota gives the VM now; 0: no quota in force (the VM is under its limit). */
  quotaCpus: number;
  limitedS: number;
}

/** The VM's limits from its file, or null (no limit, or a file without the values). */
export function powerLimitOf(r: StatsReader, s: StatsSample): PowerLimitNote | null {
  const limits = ENERGY_DOMAINS.flatMap((domain) => {
    const name = domain === 'package' ? 'power_limit' : `${domain}_power_limit`;
    const mw = r.descriptor(name) === undefined ? undefined : r.value(s, name);
    // Divided, not multiplied by the scale: 24900 mW is 24.9 W, not 24.900000000000002.
    return mw === undefined || mw === 0n ? [] : [{ domain, limitW: Number(mw) / Math.round(1 / r.scale(name)) }];
  });
  if (limits.length === 0) return null;
  return {
    limits,
    quotaCpus: Number(r.value(s, 'power_limit_cpu_quota') ?? 0n) * r.scale('power_limit_cpu_quota'),
    limitedS: Number(r.value(s, 'power_limited_time') ?? 0n) * r.scale('power_limited_time'),
  };
}

/** ", package limit 21.5 W throttled (quota 0.48 CPU, 33 s limited)" or ", package limit 30 W, dram limit 3 W ok"; '' without a limit. */
export function powerLimitNote(n: PowerLimitNote | null, lead = ', '): string {
  if (n === null) return '';
  const state = n.quotaCpus > 0 ? `throttled (quota ${n.quotaCpus.toFixed(2)} CPU, ${n.limitedS.toFixed(0)} s limited)` : 'ok';
  return `${lead}${n.limits.map((l) => `${l.domain} limit ${l.limitW} W`).join(', ')} ${state}`;
}

/**
 * The --json fields: power_limits ({domain: watts}), power_limit_w (the package's, when limited),
 * power_limit_state ("throttled" or "ok"), power_limit_cpu_quota, power_limited_s; none without a limit.
 */
export function powerLimitJson(n: PowerLimitNote | null): Record<string, number | string | Record<string, number>> {
  const pkg = n?.limits.find((l) => l.domain === 'package');
  return n === null
    ? {}
    : {
        power_limits: Object.fromEntries(n.limits.map((l) => [l.domain, l.limitW])),
        ...(pkg ? { power_limit_w: pkg.limitW } : {}),
        power_limit_state: n.quotaCpus > 0 ? 'throttled' : 'ok',
        power_limit_cpu_quota: n.quotaCpus,
        power_limited_s: n.limitedS,
      };
}
