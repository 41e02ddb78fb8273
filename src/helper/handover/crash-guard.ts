/**
 * The daemon's hooks for crashes, in one place (docs/daemon.md "Crashes"): at the start, what was kept
 * outside the last process (kept.ts) and who holds it from now on (outside-keep.ts); at every accept
 * and close, through the server's ConnectionKeep; checkpoints from serving on; nothing more once it
 * stops. The daemon calls, in order: start, restored, serving, stopping.
 */
import type { StateSnapshot } from '../../state/snapshot.js';
import type { KeeperNote } from '../../keeper/keeper-messages.js';
import { takeKeeperNote } from '../../keeper/link.js';
import { reportCrash, takeKept, type CrashLog, type Kept } from './kept.js';
import { keepCheckpoints, outsideKeep, type Checkpointed, type OutsideKeep, type StoreNotifier } from './outside-keep.js';

export class CrashGuard {
  private checkpoints: { dispose(): void } | undefined;

  private constructor(
    /** What the start found kept: the record's bytes, the legacy counters, the connections to serve. */
    readonly kept: Kept,
    private readonly note: KeeperNote | null,
    /** Who holds every connection outside this process from its accept, and the checkpoints (undefined: nobody). */
    readonly keep: OutsideKeep | undefined,
    private readonly log: CrashLog,
  ) {}

  /** Takes what the process before kept (a restart's hand-over or a crash's leftovers) out of the inherited named fds. */
  static start(named: ReadonlyMap<string, readonly number[]> | undefined, notifier: StoreNotifier, log: CrashLog): CrashGuard {
    const note = takeKeeperNote();
    const kept = takeKept(named, note, log);
    const outside = outsideKeep(notifier, kept, log) ?? undefined;
    // A process that dies before its own first checkpoint crashed restoring this one.
    if (kept.crash !== null && kept.state !== undefined) outside?.restoring();
    return new CrashGuard(kept, note, outside, log);
  }

  /** The state decoded (or not): after a crash, the one line that says what was kept and lost. */
  restored(state: StateSnapshot | undefined): void {
    reportCrash(this.kept, this.note, state, this.log);
  }

  /** Serving: checkpoints of `live` (the v2 service, when it runs) now and after every sample; the keeper learns the start is over. */
  serving(live: Checkpointed | undefined): void {
    if (this.keep === undefined) return;
    this.checkpoints = keepCheckpoints(this.keep, live, this.log);
    this.keep.ready();
  }

  /** A stop or a hand-over to the fd store: no more checkpoints, and connections closed from now on stay held by whoever holds them. */
  stopping(): void {
    this.checkpoints?.dispose();
    this.keep?.detach();
  }
}
