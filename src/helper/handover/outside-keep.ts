/**
 * What the serving process keeps outside itself so that a crash does not take it along (docs/daemon.md
 * "Crashes"): every connection from its accept to its close (or until it turns out to be v2, whose
 * clients reconnect), and a checkpoint of the live state at every interval. Two holders, one
 * interface: systemd's fd store (FDSTORE=1 under KEPT_NAMES, FDSTOREREMOVE=1 at close) when the
 * daemon runs under a NOTIFY_SOCKET with a store, or the keeper (keeper/keeper.ts) that started it.
 */
import { closeFd } from '../../os/libc/fds.js';
import { writeSealedMemfd, writeStateMemfd } from '../../state/memfd.js';
import type { Handover, StateSnapshot } from '../../state/snapshot.js';
import { KeeperLink, socketIno } from '../../keeper/link.js';
import { KEEPER_MESSAGE, KEPT_NAMES } from '../../keeper/keeper-messages.js';
import { monotonicNs } from '../../sampling/tick-loop.js';
import type { ConnectionKeep } from './frozen.js';
import type { LogSink } from '../../logging/logger.js';

/** What the fd store is reached through (lifecycle/systemd.ts's Notifier). */
export interface StoreNotifier {
  readonly socket: string | undefined;
  storeFds(name: string, fds: readonly number[], opts?: { poll?: boolean }): boolean;
  removeStoredFds(name: string): void;
}

export interface OutsideKeep extends ConnectionKeep {
  readonly holder: 'keeper' | 'fd store';
  /**
   * The latest record: `s` (and, at a stop into the fd store, what the next start takes over) in a
   * sealed memfd, handed to the holder; the one before is let go. False when the holder did not take it.
   */
  checkpoint(s: StateSnapshot, handover?: Handover): boolean;
  /** A checkpoint is about to be restored: a process that dies before its own first checkpoint crashed in the restore. */
  restoring(): void;
  /** The start is over: serving. */
  ready(): void;
  /** The event loop turns (each beat of lifecycle/loop-watchdog.ts). */
  beat(): void;
  /** From now on, closing connections (a stop, a hand-over) leaves them held: no more is released. */
  detach(): void;
}

/** The holder this process has (its keeper, else systemd's fd store), or null: then a crash loses the connections. */
export function outsideKeep(
  notifier: StoreNotifier,
  found: { checkpointNames: readonly string[]; restoringMark: boolean },
  log: LogSink<'warn'>,
): OutsideKeep | null {
  const link = KeeperLink.fromEnvironment(log);
  if (link !== null) return keeperKeep(link);
  if (notifier.socket === undefined || process.env.FDSTORE === '0') return null;
  return new FdStoreKeep(notifier, found.checkpointNames, found.restoringMark);
}

function keeperKeep(link: KeeperLink): OutsideKeep {
  let attached = true;
  return {
    holder: 'keeper',
    held(fd) {
      if (fd === undefined || !attached) return null;
      link.send(KEEPER_MESSAGE.hold, '', fd);
      return socketIno(fd);
    },
    released(ino) {
      if (ino !== null && attached) link.send(KEEPER_MESSAGE.drop, String(ino));
    },
    checkpoint(s, handover) {
      const fd = writeStateMemfd(s, handover);
      link.send(KEEPER_MESSAGE.checkpoint, '', fd);
      closeFd(fd);
      return true;
    },
    // The keeper drops a checkpoint it passed to a process that dies before sending its own.
    restoring: () => {},
    ready: () => link.send(KEEPER_MESSAGE.ready),
    beat: () => link.send(KEEPER_MESSAGE.beat),
    detach: () => void (attached = false),
  };
}

class FdStoreKeep implements OutsideKeep {
  readonly holder = 'fd store';
  private attached = true;
  /** Checkpoint names in the store, oldest first: the latest stays, the others are removed once it is stored. */
  private readonly checkpoints: string[];

  /** `found`: the checkpoints the store held at this start; `marked`: it held the restoring mark (removed with them). */
  constructor(
    private readonly notifier: StoreNotifier,
    found: readonly string[],
    private marked: boolean,
  ) {
    this.checkpoints = [...found];
  }

  held(fd: number | undefined): bigint | null {
    const ino = fd === undefined || !this.attached ? null : socketIno(fd);
    if (ino !== null) this.notifier.storeFds(`${KEPT_NAMES.connectionPrefix}${ino}`, [fd!]);
    return ino;
  }

  released(ino: bigint | null): void {
    if (ino !== null && this.attached) this.notifier.removeStoredFds(`${KEPT_NAMES.connectionPrefix}${ino}`);
  }

  checkpoint(s: StateSnapshot, handover?: Handover): boolean {
    const fd = writeStateMemfd(s, handover);
    // A name per checkpoint, ordered: FDSTOREREMOVE=1 removes every fd of a name, so the new one is
    // stored before the old one goes, and a crash between the two leaves both (the next start takes the latest).
    const name = `${KEPT_NAMES.checkpointPrefix}${monotonicNs()}`;
    const stored = this.notifier.storeFds(name, [fd], { poll: false });
    closeFd(fd);
    if (!stored) return false;
    for (const old of this.checkpoints.splice(0)) this.notifier.removeStoredFds(old);
    this.checkpoints.push(name);
    if (this.marked) this.notifier.removeStoredFds(KEPT_NAMES.restoring);
    this.marked = false;
    return true;
  }

  restoring(): void {
    const fd = writeSealedMemfd(KEPT_NAMES.restoring, Buffer.alloc(1));
    this.marked = this.notifier.storeFds(KEPT_NAMES.restoring, [fd], { poll: false });
    closeFd(fd);
  }

  ready(): void {}
  beat(): void {}

  detach(): void {
    this.attached = false;
  }
}
