/** What `watch` and `stats` add: the synthetic-energy notice, the first --json record, a VM's guest energy and power limit from its statistics file (docs/guide.md). */
import type { EnergySourceKind } from '../energy/kinds.js';
import type { StatedHost } from '../client/stated-energy-source.js';
import type { StatsReader, StatsSample } from '../client/stats-reader.js';
import { ENERGY_DOMAINS, type EnergyDomain } from '../model/domains.js';

export function energyNotice(source: EnergySourceKind | null): string | null {
  return source === 'synthetic' ? 'energy: SYNTHETIC (the helper runs with --energy-source synthetic): not a measurement' : null;
}

/** The first --json record: the daemon (its socket), its energy source and its domains (null: not said to this user). */
export function daemonJsonRecord(socket: string, host: StatedHost): string {
  return JSON.stringify({ type: 'daemon', socket, energy_source: host.energySource, domains: host.domains });
}

/** A VM's guest energy and power limit (null: none, or a file without the values). */
export interface VmNotes {
  guest: GuestEnergyJ | null;
  limit: PowerLimitNote | null;
}

export const NO_NOTES: VmNotes = { guest: null, limit: null };

export function vmNotesOf(r: StatsReader, s: StatsSample): VmNotes {
  return { guest: guestEnergyOf(r, s), limit: powerLimitOf(r, s) };
}

/** Energy QEMU was given to credit the guest, and the exact energy of the same windows (J). */
interface GuestEnergyJ {
  guestJ: number;
  exactJ: number;
  /** Windows QEMU's arithmetic turned into garbage, and the energy it credited otherwise (J); 0 from an older daemon's file. */
  garbageWindows: number;
  garbageJ: number;
}

/** The guest energy of a file made in exact mode, or null (raw mode: the file has no such values). */
function guestEnergyOf(r: StatsReader, s: StatsSample): GuestEnergyJ | null {
  const g = r.value(s, 'guest_energy');
  const x = r.value(s, 'guest_exact_energy');
  if (g === undefined || x === undefined) return null;
  return {
    guestJ: Number(g) * r.scale('guest_energy'),
    exactJ: Number(x) * r.scale('guest_exact_energy'),
    garbageWindows: Number(r.value(s, 'guest_garbage_windows') ?? 0n),
    garbageJ: Number(r.value(s, 'guest_garbage_energy') ?? 0n) * r.scale('guest_garbage_energy'),
  };
}

interface PowerLimitNote {
  /** Each domain's limit, in ENERGY_DOMAINS order (at least one). */
  limits: { domain: EnergyDomain; limitW: number }[];
  /** CPUs of bandwidth the helper's quota gives the VM now; 0: no quota in force (the VM is under its limit). */
  quotaCpus: number;
  limitedS: number;
}

/** The VM's limits from its file, or null (no limit, or a file without the values). */
function powerLimitOf(r: StatsReader, s: StatsSample): PowerLimitNote | null {
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

/** The notes after a row, each led by `lead`: ", guest 12.3 J of exact 12.4 J (0.9920)", ", package limit 30 W ok"; or ''. */
export function vmNotesText({ guest: g, limit: n }: VmNotes, lead = ', '): string {
  let text = '';
  if (g !== null && g.exactJ > 0) {
    // A poisoned guest is named, so that an operator sees it without reading the guest.
    const garbage = g.garbageWindows > 0 ? `, GARBAGE in ${g.garbageWindows} windows (${g.garbageJ.toFixed(3)} J)` : '';
    text += `${lead}guest ${g.guestJ.toFixed(3)} J of exact ${g.exactJ.toFixed(3)} J (${(g.guestJ / g.exactJ).toFixed(4)})${garbage}`;
  }
  if (n !== null) {
    const state = n.quotaCpus > 0 ? `throttled (quota ${n.quotaCpus.toFixed(2)} CPU, ${n.limitedS.toFixed(0)} s limited)` : 'ok';
    text += `${lead}${n.limits.map((l) => `${l.domain} limit ${l.limitW} W`).join(', ')} ${state}`;
  }
  return text;
}

/** The notes' --json fields: none outside exact mode or without a limit; power_limit_w only when the package is limited. */
export function vmNotesJson({ guest: g, limit: n }: VmNotes): Record<string, unknown> {
  const guest = g
    ? { guest_energy_j: g.guestJ, guest_exact_energy_j: g.exactJ, guest_garbage_windows: g.garbageWindows, guest_garbage_j: g.garbageJ }
    : {};
  const limit = n
    ? {
        power_limits: Object.fromEntries(n.limits.map((l) => [l.domain, l.limitW])),
        power_limit_w: n.limits.find((l) => l.domain === 'package')?.limitW,
        power_limit_state: n.quotaCpus > 0 ? 'throttled' : 'ok',
        power_limit_cpu_quota: n.quotaCpus,
        power_limited_s: n.limitedS,
      }
    : {};
  return { ...guest, ...limit };
}
