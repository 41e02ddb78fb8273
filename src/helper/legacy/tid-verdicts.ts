/** "Is tid T the peer's?" on every legacy request: a YES kept TID_VERDICT_MAX_AGE_MS (the reply does not depend on the tid), a NO never. */
import { performance } from 'node:perf_hooks';
import { PeerTasks } from '../../os/peer.js';

/** How long a YES verdict is reused before /proc/<pid>/task/<tid> is checked again. */
export const TID_VERDICT_MAX_AGE_MS = 100;
/** Distinct tids remembered per connection (a VM with more vCPUs just checks /proc more often). */
export const TID_VERDICTS_PER_CONNECTION = 256;

export class TidVerdicts {
  /** tid -> when last seen to be the peer's (monotonic ms). */
  private readonly checkedAt = new Map<number, number>();
  private readonly tasks: PeerTasks;

  constructor(
    procRoot: string,
    pid: number,
    private readonly now: () => number = () => performance.now(),
    private readonly maxAgeMs: number = TID_VERDICT_MAX_AGE_MS,
  ) {
    this.tasks = new PeerTasks(procRoot, pid);
  }

  /** True when `tid` is a live thread of the peer (or was, at most maxAgeMs ago). */
  belongs(tid: number): boolean {
    const t = this.now();
    const at = this.checkedAt.get(tid);
    if (at !== undefined && t - at < this.maxAgeMs && t >= at) return true;
    if (!this.tasks.has(tid)) {
      this.checkedAt.delete(tid);
      return false;
    }
    // Bounded whatever the client sends: a connection cycling through many tids starts afresh.
    if (at === undefined && this.checkedAt.size >= TID_VERDICTS_PER_CONNECTION) this.checkedAt.clear();
    this.checkedAt.set(tid, t);
    return true;
  }

  get size(): number {
    return this.checkedAt.size;
  }
}
