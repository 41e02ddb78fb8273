/** Replays a trace file: the reader's records through the replay engine. */
import { replayRecords, type ReplaySummary } from '../ratio/trace-replay.js';
import type { IntervalResult } from '../ratio/outputs.js';
import { TraceError } from '../ratio/trace-records.js';
import { readTrace, type ReadOptions } from './reader.js';

/** Every TraceError, the engine's included, names the file: "FILE: line N: why". */
export async function replayFile(path: string, onInterval?: (r: IntervalResult) => void, opts?: ReadOptions): Promise<ReplaySummary> {
  try {
    return await replayRecords(readTrace(path, opts), onInterval);
  } catch (e) {
    throw e instanceof TraceError ? e.inFile(path) : e;
  }
}
