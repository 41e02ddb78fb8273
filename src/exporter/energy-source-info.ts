/**
 * vmsr_energy_source_info{source="..."} 1: where the energy the exporter serves comes from, so that a
 * dashboard or alert can tell synthetic numbers (no RAPL read) from measured ones. The daemon states
 * it in its host statistics file (`energy_source`, docs/stats-fd.md); when it does not (a daemon that
 * predates it, or no statistics fds), the series is absent rather than a guess.
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
