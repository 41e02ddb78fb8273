/**
 * The daemon's hooks for crashes, in one place (docs/daemon.md "Crashes"): at the start, what was kept
 * outside the last process (kept.ts) and who holds it from now on (outside-keep.ts); at every accept
 * and close, through the server's ConnectionKeep; checkpoints from serving on; nothing more once it
 * stops. The daemon calls, in order: start, restore, serving, stopping.
 */
import type { StateSnapshot } from '../../state/snapshot.js';
import type { KeeperNote } from '../../keeper/keeper-messages.js';
import { takeKeeperNote } from '../../keeper/link.js';
import { decodeKeptState, reportCrash, takeKept, type CrashLog, type Kept } from './kept.js';
import { outsideKeep, type OutsideKeep, type StoreNotifier } from './outside-keep.js';

/** What is checkpointed (the v2 service, V2Service): its interval's checkpoint step, given the live state after every sample before any client is told of it. */
interface Checkpointed {
  checkpointTo(to: ((state: StateSnapshot | Error) => void) | null): void;
}

export class CrashGuard {
  private checkpointed: Checkpointed | undefined;

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

  /**
   * The kept state, decoded once the requests that waited through a restart are read and answered
   * (the event loop polled for I/O: an immediate set in the poll phase runs before the next poll, so
   * the second one runs after it); after a crash, the one line that says what was kept and lost.
   */
  async restore(): Promise<StateSnapshot | undefined> {
    await new Promise((resolve) => setImmediate(() => setImmediate(resolve)));
    const state = this.kept.state && decodeKeptState(this.kept.state, this.log);
    reportCrash(this.kept, this.note, state, this.log);
    return state;
  }

  /**
   * Serving: checkpoints of `live` (the v2 service, when it runs) now and after every sample; the
   * keeper learns the start is over. A snapshot that cannot be taken is logged once per run of
   * failures; the last good checkpoint stays.
   */
  serving(live: Checkpointed | undefined): void {
    const keep = this.keep;
    if (keep === undefined) return;
    let failing = false;
    live?.checkpointTo((state) => {
      try {
        if (state instanceof Error) throw state;
        keep.checkpoint(state);
        failing = false;
      } catch (e) {
        if (!failing)
          this.log.warn({ err: (e as Error).message }, `cannot checkpoint the live state: the ${keep.holder} keeps the last one`);
        failing = true;
      }
    });
    this.checkpointed = live;
    keep.ready();
  }

  /** A stop or a hand-over to the fd store: no more checkpoints, and connections closed from now on stay held by whoever holds them. */
  stopping(): void {
    this.checkpointed?.checkpointTo(null);
    this.keep?.detach();
  }
}
