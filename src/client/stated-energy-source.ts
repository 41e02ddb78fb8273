/** The helper's energy source and RAPL domains from its host statistics file; null: not said (not readable, or older). */
import { energySourceOfCode, type EnergySourceKind } from '../energy/kinds.js';
import { OTHER_DOMAINS, type EnergyDomain } from '../model/domains.js';
import { StatsReader } from './stats-reader.js';
import type { V2Client } from './v2-client.js';

export interface StatedHost {
  energySource: EnergySourceKind | null;
  domains: EnergyDomain[] | null;
}

export async function statedHost(client: Pick<V2Client, 'statsFd'>): Promise<StatedHost> {
  let reader: StatsReader;
  try {
    reader = StatsReader.open((await client.statsFd(0)).fd);
  } catch {
    return { energySource: null, domains: null }; // refused (not root, not in the observer group) or not offered by this helper
  }
  try {
    const domains: EnergyDomain[] = ['package', ...OTHER_DOMAINS.filter((d) => reader.descriptor(`${d}_energy`) !== undefined)];
    let energySource: EnergySourceKind | null = null;
    try {
      energySource = energySourceOfCode(reader.value(reader.read(), 'energy_source'));
    } catch {
      /* not stated */
    }
    return { energySource, domains };
  } finally {
    reader.close();
  }
}
