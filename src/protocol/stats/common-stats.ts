/** The descriptors every statistics file of the helper starts with (docs/stats-fd.md "Both files start with"). */
import { STATS_BASE, STATS_TYPE, STATS_UNIT } from './flags.js';
import type { StatsDescriptor } from './layout.js';
import { GENERATION, type SampleBlock } from './sample-block.js';

const NS = { flags: STATS_TYPE.INSTANT | STATS_UNIT.SECONDS | STATS_BASE.POW10, exponent: -9, size: 1 };

export const COMMON_STATS: readonly StatsDescriptor[] = [
  { name: GENERATION, flags: STATS_TYPE.INSTANT | STATS_UNIT.NONE, exponent: 0, size: 1 },
  { name: 'sample_monotonic', ...NS },
  { name: 'sample_realtime', ...NS },
  { name: 'next_sample_monotonic', ...NS },
  { name: 'interval', ...NS },
];

/** The common values of one sample, ns (0 before the first sample). */
export interface SampleTimes {
  monotonicNs: bigint;
  realtimeNs: bigint;
  /** CLOCK_MONOTONIC at which the next sample is expected; 0 = none is expected (ended, or the loop is idle). */
  nextMonotonicNs: bigint;
  /** Measured length of the interval that ended with this sample (0 for a baseline). */
  intervalNs: bigint;
}

type SampleTimeSlots = ReturnType<typeof sampleTimeSlots>;

export function sampleTimeSlots(b: SampleBlock) {
  return {
    monotonic: b.slot('sample_monotonic'),
    realtime: b.slot('sample_realtime'),
    next: b.slot('next_sample_monotonic'),
    interval: b.slot('interval'),
  };
}

/** The sample's times into the block; `at` resolved once by a writer that writes often. */
export function writeSampleTimes(b: SampleBlock, t: SampleTimes, at: SampleTimeSlots = sampleTimeSlots(b)): void {
  b.setBig(at.monotonic, t.monotonicNs);
  b.setBig(at.realtime, t.realtimeNs);
  b.setBig(at.next, t.nextMonotonicNs);
  b.setBig(at.interval, t.intervalNs);
}
