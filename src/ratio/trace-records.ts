/** The records of a vmsr-trace, parsed: what the replay engine consumes, and the error naming their line. */
import type { Sample, TraceHeader, VmSpec } from './types.js';

export class TraceError extends Error {
  /** 1-based line number, when the problem belongs to a line. */
  readonly line: number | undefined;
  constructor(message: string, line?: number) {
    super(line === undefined ? message : `line ${line}: ${message}`);
    this.name = 'TraceError';
    this.line = line;
  }
}

export type TraceRecord =
  | { type: 'header'; line: number; header: TraceHeader }
  | { type: 'register'; line: number; tNs: bigint; vm: VmSpec }
  | { type: 'sample'; line: number; sample: Sample }
  | { type: 'unregister'; line: number; tNs: bigint; pid: number };
