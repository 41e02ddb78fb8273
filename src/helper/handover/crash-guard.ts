/**
 * The daemon's hooks for crashes (docs/daemon.md "Crashes"), called in order: start (what was kept,
 * and who holds it from now on), restore, serving (checkpoints), stopping.
 */
import type { StateSnapshot } from '../../state/snapshot.js';
import type { KeeperNote } from '../../keeper/keeper-messages.js';
import { takeKeeperNote } from '../../keeper/link.js';
import { decodeState } from '../../state/snapshot-codec.js';
import { reportCrash, takeKept, type CrashLog, type Kept } from './kept.js';
import { outsideKeep, type OutsideKeep, type StoreNotifier } from './outside-keep.js';

/** The v2 service: given the live state after every sample, before any client is told of it. */
interface Checkpointed {
  checkpointTo(to: ((state: StateSnapshot | Error) => void) | null): void;
}

export class CrashGuard {
  private checkpointed: Checkpointed | undefined;

  private constructor(
    readonly kept: Kept,
    private readonly note: KeeperNote | null,
    /** Undefined: nobody holds anything outside this process. */
    readonly keep: OutsideKeep | undefined,
    private readonly log: CrashLog,
  ) {}

  /** Takes what the process before kept out of the inherited named fds. */
  static start(named: ReadonlyMap<string, readonly number[]> | undefined, notifier: StoreNotifier, log: CrashLog): CrashGuard {
    const note = takeKeeperNote();
    const kept = takeKept(named, note, log);
    const outside = outsideKeep(notifier, kept, log) ?? undefined;
    // A process that dies before its own first checkpoint crashed restoring this one.
    if (kept.crash !== null && kept.state !== undefined) outside?.restoring();
    return new CrashGuard(kept, note, outside, log);
  }

  /**
   * The kept state (undefined, logged, when it does not decode), once the requests that waited through
   * a restart are answered (an immediate set in the poll phase runs before the next poll, so the second
   * one runs after it); after a crash, the one line that says what was kept and lost.
   */
  async restore(): Promise<StateSnapshot | undefined> {
    await new Promise((resolve) => setImmediate(() => setImmediate(resolve)));
    const r = this.kept.state && decodeState(this.kept.state);
    if (r && !r.ok) this.log.warn({ err: r.error }, 'saved state not restored: starting fresh');
    const state = r?.ok ? r.value : undefined;
    reportCrash(this.kept, this.note, state, this.log);
    return state;
  }

  /** Checkpoints of `live` after every sample (a failure logged once per run of them; the last good one stays). */
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

  /** No more checkpoints; connections closed from now on stay held. */
  stopping(): void {
    this.checkpointed?.checkpointTo(null);
    this.keep?.detach();
  }
}
