/** After a flood of closes RSS would stay at its high-water mark (V8 garbage, glibc's free chunks): a full GC and malloc_trim(0). */
import v8 from 'node:v8';
import vm from 'node:vm';
import { mallocTrim } from '../../os/libc/memfd-mmap.js';
import { dropCleanFilePages } from '../../os/mapped-files.js';

const SETTLE_AFTER = 256;
const QUIET_MS = 1000;
const QUIET_REQUESTS = 1000;
const MAX_WAITS = 10;

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

/**
 * After SETTLE_AFTER closes, two passes a quiet second apart: a second without an accept or a close and with fewer than
 * QUIET_REQUESTS legacy requests (QEMU connects once and asks about once a second per package). A pass in the middle of
 * a load stalls it (a full GC is 9-13 ms); under a load that never quiets, the passes go ahead after MAX_WAITS seconds.
 */
export class MemorySettler {
  private churn = 0;
  private closedSince = 0;
  private timer: NodeJS.Timeout | undefined;
  private last = { churn: 0, requests: 0 };
  private waits = 0;
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
    if (++this.closedSince >= SETTLE_AFTER && !this.timer) this.wait();
  }

  stop(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
  }

  private wait(): void {
    this.last = { churn: this.churn, requests: this.requests() };
    this.timer = setTimeout(() => this.look(), QUIET_MS);
    this.timer.unref();
  }

  private look(): void {
    const quiet = this.churn === this.last.churn && this.requests() - this.last.requests < QUIET_REQUESTS;
    if (!quiet && ++this.waits < MAX_WAITS) return this.wait();
    const first = this.first ?? { closed: this.closedSince, rssBeforeMb: rssMb() };
    settlePass(false);
    // Twice: what the first pass freed (native handles close asynchronously, weak callbacks run after a GC) is collectable then.
    if (this.first === null) {
      [this.first, this.closedSince] = [first, 0];
      return this.wait();
    }
    [this.first, this.timer, this.waits] = [null, undefined, 0];
    this.onSettle(first.rssBeforeMb, rssMb(), first.closed);
  }
}
