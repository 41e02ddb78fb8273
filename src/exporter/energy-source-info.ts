/**
 * vmsr_energy_source_info{source="..."} 1, so that a dashboard can tell synthetic numbers from
 * measured ones; absent, never a guess, when the daemon's host statistics file does not state it.
 */
import { Gauge, type Registry, type RegistryContentType } from 'prom-client';
import type { EnergySourceKind } from '../energy/kinds.js';

export const ENERGY_SOURCE_INFO = 'vmsr_energy_source_info';

/** Adds the family to `registers`; `source()` is read at each scrape. */
export function addEnergySourceInfo(registers: Registry<RegistryContentType>[], source: () => EnergySourceKind | null): void {
  new Gauge({
    name: ENERGY_SOURCE_INFO,
    help: "Where the helper daemon's energy comes from: msr, powercap, or synthetic (not a measurement)",
    labelNames: ['source'],
    registers,
    collect() {
      this.reset();
      const s = source();
      if (s !== null) this.set({ source: s }, 1);
    },
  });
}
