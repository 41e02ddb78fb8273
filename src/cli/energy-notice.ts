/**
 * What `watch` and `stats` say of the helper they read (client/stated-energy-source.ts): the line above
 * their tables when its energy is synthetic (numbers from such a helper are not measurements), and the
 * first record of their --json output (docs/guide.md "JSON output").
 */
import type { EnergySourceKind } from '../energy/kinds.js';
import type { StatedHost } from '../client/stated-energy-source.js';

export function energyNotice(source: EnergySourceKind | null): string | null {
  return source === 'synthetic' ? 'energy: SYNTHETIC (the helper runs with --energy-source synthetic): not a measurement' : null;
}

/** The first --json record: the daemon (its socket), its energy source and its domains (null: not said to this user). */
export function daemonJsonRecord(socket: string, host: StatedHost): string {
  return JSON.stringify({ type: 'daemon', socket, energy_source: host.energySource, domains: host.domains });
}
