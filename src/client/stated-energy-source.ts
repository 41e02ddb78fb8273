/**
 * Where the helper says its energy comes from: the `energy_source` of its host statistics file
 * (docs/stats-fd.md), read once through STATS_FD. The host's file is for root and the observer group:
 * for anyone else, and for a helper that predates the value, the answer is null ("not said").
 */
import { energySourceOfCode, type EnergySourceKind } from '../energy/kinds.js';
import { StatsReader } from './stats-reader.js';
import type { V2Client } from './v2-client.js';

export async function statedEnergySource(client: Pick<V2Client, 'statsFd'>): Promise<EnergySourceKind | null> {
  let reader: StatsReader;
  try {
    reader = StatsReader.open((await client.statsFd(0)).fd);
  } catch {
    return null; // refused (not root, not in the observer group) or not offered by this helper
  }
  try {
    return energySourceOfCode(reader.value(reader.read(), 'energy_source'));
  } catch {
    return null;
  } finally {
    reader.close();
  }
}
