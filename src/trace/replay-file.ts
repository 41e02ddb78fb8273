/** Replays a trace file: the reader's records through the replay engine. */
import { replayRecords, type ReplaySummary } from '../ratio/replay.js';
import type { IntervalResult } from '../ratio/types.js';
import { readTrace, type ReadOptions } from './reader.js';

export function replayFile(path: string, onInterval?: (r: IntervalResult) => void, opts?: ReadOptions): Promise<ReplaySummary> {
  return replayRecords(readTrace(path, opts), onInterval);
}
