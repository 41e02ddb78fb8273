/** After a flood of closes RSS would stay at its high-water mark (V8 garbage, glibc's free chunks): a full GC and malloc_trim(0). */
import v8 from 'node:v8';
import vm from 'node:vm';
import { mallocTrim } from '../../os/libc/memfd-mmap.js';
import { dropCleanFilePages } from '../../os/mapped-files.js';

const SETTLE_AFTER = 256;
/** A quiet second is looked for in steps of a quarter: one second out of step with a load would miss its pauses. */
const LOOK_MS = 250;
const QUIET_LOOKS = 4;
const QUIET_REQUESTS = 1000;
const MAX_LOOKS = 40;

let gcFn: (() => void) | null | undefined;

/** A full garbage collection: V8's gc(), exposed at run time (a context made after the flag has it). */
function fullGc(): void {
  if (gcFn === undefined) {
    const global = (globalThis as { gc?: () => void }).gc;
    if (typeof global === 'function') gcFn = global;
    else
      try {
        v8.setFlagsFromString('--expose-gc');
        gcFn = vm.runInNewContext('gc') as () => void;
      } catch {
        gcFn = null;
      }
  }
  gcFn?.();
}

function settlePass(filePages: boolean): void {
  fullGc();
  mallocTrim();
  if (filePages) dropCleanFilePages();
}

const rssMb = () => Math.round(process.memoryUsage.rss() / 2 ** 20);

/** Settles memory once, now (start-up done); returns the RSS before and after, MiB. */
export function settleOnce(): { rssBeforeMb: number; rssAfterMb: number } {
  const rssBeforeMb = rssMb();
  settlePass(true);
  return { rssBeforeMb, rssAfterMb: rssMb() };
}

type Mark = { churn: number; requests: number };

/**
 * After SETTLE_AFTER closes, two passes a quiet second apart: a second without an accept or a close and with fewer than
 * QUIET_REQUESTS legacy requests (QEMU connects once and asks about once a second per package). A pass in the middle of
 * a load stalls it (a full GC is 9-13 ms); under a load that never quiets, the passes go ahead after MAX_LOOKS steps (10 s).
 */
export class MemorySettler {
  private churn = 0;
  private closedSince = 0;
  private timer: NodeJS.Timeout | undefined;
  /** The activity at each of the last QUIET_LOOKS steps: the first a quiet second ago. */
  private marks: Mark[] = [];
  private looks = 0;
  /** Taken at the first pass; null before it. */
  private first: { closed: number; rssBeforeMb: number } | null = null;

  constructor(
    private readonly requests: () => number,
    private readonly onSettle: (rssBeforeMb: number, rssAfterMb: number, closed: number) => void,
  ) {}

  accepted(): void {
    this.churn++;
  }

  closed(): void {
    this.churn++;
    if (++this.closedSince >= SETTLE_AFTER && !this.timer) this.wait([]);
  }

  stop(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
  }

  private wait(marks: Mark[]): void {
    this.marks = [...marks, { churn: this.churn, requests: this.requests() }].slice(-QUIET_LOOKS);
    this.timer = setTimeout(() => this.look(), LOOK_MS);
    this.timer.unref();
  }

  private look(): void {
    const [from, now] = [this.marks[0]!, { churn: this.churn, requests: this.requests() }];
    const quiet = this.marks.length === QUIET_LOOKS && now.churn === from.churn && now.requests - from.requests < QUIET_REQUESTS;
    if (!quiet && ++this.looks < MAX_LOOKS) return this.wait(this.marks);
    const first = this.first ?? { closed: this.closedSince, rssBeforeMb: rssMb() };
    settlePass(false);
    // Twice: what the first pass freed (native handles close asynchronously, weak callbacks run after a GC) is collectable then.
    if (this.first === null) {
      [this.first, this.closedSince] = [first, 0];
      return this.wait([]);
    }
    [this.first, this.timer, this.looks] = [null, undefined, 0];
    this.onSettle(first.rssBeforeMb, rssMb(), first.closed);
  }
}
