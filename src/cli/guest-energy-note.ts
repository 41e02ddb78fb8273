/**
 * A VM's guest energy as `stats` and `watch` show it (--guest-energy exact, docs/guest-energy.md):
 * what QEMU was given to credit the guest against the exact energy of the same windows, read from the
 * VM's statistics file (its `guest_energy` and `guest_exact_energy`, present only in exact mode).
 */
import type { StatsReader, StatsSample } from '../client/stats-reader.js';

/** Energy QEMU was given to credit the guest, and the exact energy of the same windows (J). */
export interface GuestEnergyJ {
  guestJ: number;
  exactJ: number;
  /** Windows QEMU's arithmetic turned into garbage, and the energy it credited otherwise (J); 0 from an older daemon's file. */
  garbageWindows: number;
  garbageJ: number;
}

/** The guest energy of a file made in exact mode, or null (raw mode: the file has no such values). */
export function guestEnergyOf(r: StatsReader, s: StatsSample): GuestEnergyJ | null {
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

/** ", guest 12.3 J of exact 12.4 J (0.992)" in exact mode, once QEMU was given anything; '' otherwise. */
export function guestEnergyNote(g: GuestEnergyJ | null, lead = ', '): string {
  if (g === null || g.exactJ <= 0) return '';
  // A poisoned guest is named, so that an operator sees it without reading the guest.
  const garbage = g.garbageWindows > 0 ? `, GARBAGE in ${g.garbageWindows} windows (${g.garbageJ.toFixed(3)} J)` : '';
  return `${lead}guest ${g.guestJ.toFixed(3)} J of exact ${g.exactJ.toFixed(3)} J (${(g.guestJ / g.exactJ).toFixed(4)})${garbage}`;
}

/** The --json fields: guest_energy_j, guest_exact_energy_j, guest_garbage_windows and guest_garbage_j, none outside exact mode. */
export function guestEnergyJson(g: GuestEnergyJ | null): {
  guest_energy_j?: number;
  guest_exact_energy_j?: number;
  guest_garbage_windows?: number;
  guest_garbage_j?: number;
} {
  return g
    ? { guest_energy_j: g.guestJ, guest_exact_energy_j: g.exactJ, guest_garbage_windows: g.garbageWindows, guest_garbage_j: g.garbageJ }
    : {};
}
