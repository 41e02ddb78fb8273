/** The daemon-wide health counters HOST_UPDATE carries: legacy requests, connections, samples, VMs. */
import type { LegacyCounters } from '../legacy/legacy-service.js';
import type { SamplingStats } from '../../sampling/sampling-service.js';
import type { DaemonCounters } from '../../protocol/v2/codec.js';

/** Daemon-wide health counters HOST_UPDATE carries (legacy requests, connections). */
export interface HealthSource {
  legacy: LegacyCounters;
  connections(): number;
}

/** HOST_UPDATE's stats; without a health source (the v2 service alone) legacy counts 0, connections the v2 ones. */
export function daemonCounters(
  health: HealthSource | undefined,
  sampling: SamplingStats,
  v2Connections: number,
  vms: number,
): DaemonCounters {
  return {
    legacyOk: BigInt(health?.legacy.ok ?? 0),
    legacyRefused: BigInt(health?.legacy.refused ?? 0),
    legacyFailed: BigInt(health?.legacy.failed ?? 0),
    lastSampleDurationNs: sampling.lastDurationNs,
    samples: BigInt(sampling.samples),
    sampleFailures: BigInt(sampling.failures),
    connections: health ? health.connections() : v2Connections,
    vms,
  };
}
