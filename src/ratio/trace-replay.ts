/** Replay: trace records in (trace/reader.ts parses them), interval results and final totals out. Pure. */
import { RatioEngine } from './attribution.js';
import { TraceError, type TraceRecord } from './trace-records.js';
import { MAX_VMS } from '../model/vm.js';
import type { IntervalResult, VmOutput } from './outputs.js';
import type { TraceHeader } from '../model/sample.js';

/** Problems are counted; only the first few are kept, so a bad trace cannot grow memory. */
export const KEPT_PROBLEMS = 10;

export interface ReplaySummary {
  header: TraceHeader;
  intervals: number;
  samples: number;
  /** attributedS: the sum of dt over the intervals in which the VM was attributed, seconds. */
  vms: { output: VmOutput; attributedS: number }[];
  problems: { count: number; first: string[] };
}

export class Replay {
  readonly engine: RatioEngine;
  readonly problems: ReplaySummary['problems'] = { count: 0, first: [] };
  private intervals = 0;
  private samples = 0;
  /** pid -> vmIds registered with it and not yet unregistered, oldest first. */
  private readonly byPid = new Map<number, number[]>();
  private readonly attributedS = new Map<number, number>();

  /** A trace can register VMs without end (a gzip bomb of register lines): past maxVms the replay stops. */
  private registered = 0;

  constructor(
    readonly header: TraceHeader,
    private readonly maxVms = MAX_VMS,
  ) {
    this.engine = new RatioEngine(header.host);
  }

  /** Applies one record after the header; returns the interval a sample closes, if any. */
  apply(rec: Exclude<TraceRecord, { type: 'header' }>): IntervalResult | null {
    try {
      switch (rec.type) {
        case 'register': {
          if (++this.registered > this.maxVms)
            throw new TraceError(`the trace registers more than ${this.maxVms} VMs; replay holds at most that many`, rec.line);
          const id = this.engine.register(rec.vm);
          this.byPid.set(rec.vm.pid, [...(this.byPid.get(rec.vm.pid) ?? []), id]);
          this.attributedS.set(id, 0);
          return null;
        }
        case 'unregister': {
          const ids = this.byPid.get(rec.pid);
          const id = ids?.shift();
          if (id === undefined) {
            this.problem(`line ${rec.line}: unregister of pid ${rec.pid}, which is not registered: ignored`);
            return null;
          }
          if (ids!.length === 0) this.byPid.delete(rec.pid);
          this.engine.unregister(id);
          return null;
        }
        case 'gap': {
          // The counters may have wrapped any number of times: nothing attributed across the gap, the next sample a baseline.
          this.engine.gap();
          this.problem(
            `line ${rec.line}: ${rec.lostSamples} samples missing from here (the recorder's disk was full): no energy attributed across the gap`,
          );
          return null;
        }
        case 'sample': {
          this.samples++;
          const r = this.engine.addSample(rec.sample);
          const problems = r ? r.problems : this.engine.lastProblems;
          for (const p of problems) this.problem(`line ${rec.line}: ${p}`);
          if (!r) return null;
          this.intervals++;
          for (const vm of r.vms) this.attributedS.set(vm.vmId, (this.attributedS.get(vm.vmId) ?? 0) + r.dtS);
          return r;
        }
      }
    } catch (e) {
      // The reader validates first; this only turns an engine refusal into an error naming the line.
      if (e instanceof TraceError) throw e;
      throw new TraceError((e as Error).message, rec.line);
    }
  }

  summary(): ReplaySummary {
    return {
      header: this.header,
      intervals: this.intervals,
      samples: this.samples,
      vms: this.engine.outputs().map((output) => ({ output, attributedS: this.attributedS.get(output.vmId) ?? 0 })),
      problems: { count: this.problems.count, first: [...this.problems.first] },
    };
  }

  private problem(text: string): void {
    this.problems.count++;
    if (this.problems.first.length < KEPT_PROBLEMS) this.problems.first.push(text);
  }
}

/** Replays records (header first); calls onInterval for each interval, in order. */
export async function replayRecords(
  records: AsyncIterable<TraceRecord> | Iterable<TraceRecord>,
  onInterval: (r: IntervalResult) => void = () => {},
): Promise<ReplaySummary> {
  let replay: Replay | undefined;
  for await (const rec of records) {
    if (rec.type === 'header') {
      try {
        replay = new Replay(rec.header);
      } catch (e) {
        // The reader checks the header by the engine's rules; this only names the line of any it missed.
        throw new TraceError(`header: ${(e as Error).message}`, rec.line);
      }
      continue;
    }
    if (!replay) throw new TraceError('a record before the header', rec.line);
    const r = replay.apply(rec);
    if (r) onInterval(r);
  }
  if (!replay) throw new TraceError('no header: the trace is empty');
  return replay.summary();
}
