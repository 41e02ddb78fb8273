/**
 * The line `watch` and `stats` print above their tables when the helper says its energy is synthetic
 * (client/stated-energy-source.ts): numbers from such a helper are not measurements.
 */
import type { EnergySourceKind } from '../energy/kinds.js';

export function energyNotice(source: EnergySourceKind | null): string | null {
  return source === 'synthetic' ? 'energy: SYNTHETIC (the helper runs with --energy-source synthetic): not a measurement' : null;
}
