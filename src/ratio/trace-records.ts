/** The records of a vmsr-trace, parsed: what the replay engine consumes, and the error naming their line. */
import type { Sample, TraceHeader } from '../model/sample.js';
import type { VmSpec } from '../model/vm.js';

export class TraceError extends Error {
  constructor(
    readonly reason: string,
    /** 1-based. */
    readonly line?: number,
    readonly file?: string,
  ) {
    const where = line === undefined ? '' : `line ${line}: `;
    // Errors about opening the file already name it.
    const named = file === undefined || reason.includes(file) ? '' : `${file}: `;
    super(`${named}${where}${reason}`);
    this.name = 'TraceError';
  }

  /** The same error, naming the file it came from. */
  inFile(file: string): TraceError {
    return this.file === undefined ? new TraceError(this.reason, this.line, file) : this;
  }
}

export type TraceRecord =
  | { type: 'header'; line: number; header: TraceHeader }
  | { type: 'register'; line: number; tNs: bigint; vm: VmSpec }
  | { type: 'sample'; line: number; sample: Sample }
  | { type: 'unregister'; line: number; tNs: bigint; pid: number }
  /** Samples are missing from tNs on (the recorder's disk was full): the next sample is a new baseline. */
  | { type: 'gap'; line: number; tNs: bigint; lostSamples: number };
