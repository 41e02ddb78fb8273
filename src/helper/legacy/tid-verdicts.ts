/**
 * "Is tid T a thread of this connection's peer?", asked on every legacy request. QEMU asks with the
 * same few vCPU tids every time, so a YES is remembered per connection for at most
 * TID_VERDICT_MAX_AGE_MS and then checked against /proc again. A NO is never remembered: a thread the
 * peer starts later is accepted at once.
 *
 * The bound: a thread that exits is still accepted for at most TID_VERDICT_MAX_AGE_MS after the
 * check that saw it. A tid can only be reused after its thread exited and the kernel's pid counter
 * wrapped around pid_max, so within that window a reused tid (even one now in another process) is
 * answered as the old thread was. The reply does not depend on the tid (it is the package's
 * register), so the window changes who may ask for that long, never what is answered.
 */
import { performance } from 'node:perf_hooks';
import { PeerTasks } from '../../os/peer.js';

/** How long a YES verdict is reused before /proc/<pid>/task/<tid> is checked again. */
export const TID_VERDICT_MAX_AGE_MS = 100;
/** Distinct tids remembered per connection (a VM with more vCPUs just checks /proc more often). */
export const TID_VERDICTS_PER_CONNECTION = 256;

export class TidVerdicts {
  /** tid -> when it was last seen to be the peer's (monotonic ms). */
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

  /** tids remembered now (for tests). */
  get size(): number {
    return this.checkedAt.size;
  }
}
