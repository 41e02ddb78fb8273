/** After a flood of closes RSS would stay at its high-water mark (V8 garbage, glibc's free chunks): a full GC and malloc_trim(0). */
import v8 from 'node:v8';
import vm from 'node:vm';
import { mallocTrim } from '../../os/libc/memfd-mmap.js';
import { dropCleanFilePages } from '../../os/mapped-files.js';

const SETTLE_AFTER = 256;
const QUIET_MS = 1000;

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

export class MemorySettler {
  private closed_ = 0;
  private timer: NodeJS.Timeout | undefined;

  constructor(private readonly onSettle: (rssBeforeMb: number, rssAfterMb: number, closed: number) => void) {}

  closed(): void {
    if (++this.closed_ < SETTLE_AFTER) return;
    // (a close during the second pass's wait simply pushes it back, as during the quiet wait)
    if (this.timer) this.timer.refresh();
    else {
      this.timer = setTimeout(() => this.settle(), QUIET_MS);
      this.timer.unref();
    }
  }

  stop(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
  }

  private settle(): void {
    this.timer = undefined;
    const closed = this.closed_;
    this.closed_ = 0;
    const before = rssMb();
    settlePass(false);
    // Again later: what the first pass freed (native handles close asynchronously, weak callbacks run after a GC) is collectable then.
    this.timer = setTimeout(() => {
      this.timer = undefined;
      settlePass(false);
      this.onSettle(before, rssMb(), closed);
    }, QUIET_MS);
    this.timer.unref();
  }
}
