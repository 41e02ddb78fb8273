/**
 * The daemon's hooks for crashes, in one place (docs/daemon.md "Crashes"): at the start, what was kept
 * outside the last process (kept.ts) and who holds it from now on (outside-keep.ts); at every accept
 * and close, through the server's ConnectionKeep; checkpoints from serving on; nothing more once it
 * stops. The daemon calls, in order: start, merge, restored, serving, stopping.
 */
import type { StateSnapshot } from '../../state/snapshot.js';
import type { KeeperNote } from '../../keeper/keeper-messages.js';
import { takeKeeperNote } from '../../keeper/link.js';
import type { ConnectionKeep } from '../server/connection-keep.js';
import type { HandedOver } from '../handover/handed-over.js';
import { reportCrash, takeKept, type CrashLog, type Kept } from './kept.js';
import { keepCheckpoints, outsideKeep, type Checkpointed, type OutsideKeep } from './outside-keep.js';
import type { Notifier } from './systemd.js';

export class CrashGuard {
  private checkpoints: { dispose(): void } | undefined;

  private constructor(
    private readonly kept: Kept,
    private readonly note: KeeperNote | null,
    private readonly outside: OutsideKeep | null,
    private readonly log: CrashLog,
  ) {}

  /** Takes the kept parts out of the inherited named fds; `named` is what is left for takeHandedOver. */
  static start(named: ReadonlyMap<string, readonly number[]> | undefined, notifier: Notifier, log: CrashLog): CrashGuard {
    const note = takeKeeperNote();
    const kept = takeKept(named, note, log);
    return new CrashGuard(kept, note, outsideKeep(notifier, kept, log), log);
  }

  get named(): ReadonlyMap<string, readonly number[]> {
    return this.kept.named;
  }

  /** For the server: every connection held outside from its accept (undefined: nobody holds them). */
  get keep(): ConnectionKeep | undefined {
    return this.outside ?? undefined;
  }

  /** Adds a crash's kept connections and checkpoint to what a restart handed over. */
  merge(handed: HandedOver): HandedOver {
    const crash = this.kept.crash;
    if (crash !== null) {
      handed.connections.push(...crash.connections);
      if (handed.state === undefined && crash.state !== undefined) {
        handed.state = crash.state;
        this.outside?.restoring();
      }
    }
    return handed;
  }

  /** The state decoded (or not): after a crash, the one line that says what was kept and lost. */
  restored(state: StateSnapshot | undefined): void {
    if (this.kept.crash !== null) reportCrash(this.kept.crash, this.note, state, this.log);
  }

  /** Serving: checkpoints of `live` (the v2 service, when it runs) now and after every sample; the keeper learns the start is over. */
  serving(live: Checkpointed | undefined): void {
    if (this.outside === null) return;
    this.checkpoints = keepCheckpoints(this.outside, live, this.log);
    this.outside.ready();
  }

  /** A stop or a hand-over to the fd store: connections closed from now on stay held by whoever holds them. */
  stopping(): void {
    this.checkpoints?.dispose();
    this.outside?.detach();
  }
}
