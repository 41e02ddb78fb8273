/**
 * What the serving process keeps outside itself so that a crash does not take it along (docs/daemon.md
 * "Crashes"): each connection from its accept to its close (or v2), a checkpoint at every interval.
 */
import { closeFd } from '../../os/libc/fds.js';
import { writeSealedMemfd, writeStateMemfd } from '../../state/memfd.js';
import type { Handover, StateSnapshot } from '../../state/snapshot.js';
import { connectionIno, KeeperLink } from '../../keeper/link.js';
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
  /** Hands the holder the latest record (the one before is let go); false when it did not take it. */
  checkpoint(s: StateSnapshot, handover?: Handover): boolean;
  /** A checkpoint is about to be restored (a death before the next one is a crash in the restore). */
  restoring(): void;
  ready(): void;
  /** The event loop turns (lifecycle/loop-watchdog.ts). */
  beat(): void;
  /** From now on, closing connections (a stop, a hand-over) leaves them held. */
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
  return fdStoreKeep(notifier, found.checkpointNames, found.restoringMark);
}

function keeperKeep(link: KeeperLink): OutsideKeep {
  return {
    holder: 'keeper',
    ...connectionKeep(
      (fd) => link.send(KEEPER_MESSAGE.hold, '', fd),
      (ino) => link.send(KEEPER_MESSAGE.drop, String(ino)),
    ),
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
  };
}

/** The fd store: FDSTORE=1 under KEPT_NAMES, FDSTOREREMOVE=1 at close; `found`, `marked`: the checkpoints and restoring mark it held at this start. */
function fdStoreKeep(notifier: StoreNotifier, found: readonly string[], marked: boolean): OutsideKeep {
  /** Oldest first: the latest stays, the others are removed once it is stored. */
  const checkpoints = [...found];
  return {
    holder: 'fd store',
    ...connectionKeep(
      (fd, ino) => notifier.storeFds(`${KEPT_NAMES.connectionPrefix}${ino}`, [fd]),
      (ino) => notifier.removeStoredFds(`${KEPT_NAMES.connectionPrefix}${ino}`),
    ),
    checkpoint(s, handover) {
      const fd = writeStateMemfd(s, handover);
      // A name per checkpoint, ordered: FDSTOREREMOVE=1 removes every fd of a name, so the new one is
      // stored before the old one goes, and a crash between the two leaves both (the next start takes the latest).
      const name = `${KEPT_NAMES.checkpointPrefix}${monotonicNs()}`;
      const stored = notifier.storeFds(name, [fd], { poll: false });
      closeFd(fd);
      if (!stored) return false;
      for (const old of checkpoints.splice(0)) notifier.removeStoredFds(old);
      checkpoints.push(name);
      if (marked) notifier.removeStoredFds(KEPT_NAMES.restoring);
      marked = false;
      return true;
    },
    restoring() {
      const fd = writeSealedMemfd(KEPT_NAMES.restoring, Buffer.alloc(1));
      marked = notifier.storeFds(KEPT_NAMES.restoring, [fd], { poll: false });
      closeFd(fd);
    },
    ready: () => {},
    beat: () => {},
  };
}

/** held/released/detach: `hold` and `drop` see each connection (named by its inode, as the keeper names it) until detach(). */
function connectionKeep(hold: (fd: number, ino: bigint) => void, drop: (ino: bigint) => void) {
  let attached = true;
  return {
    held(fd: number | undefined): bigint | null {
      const c = fd === undefined || !attached ? null : connectionIno(fd);
      if (c === null || !('ino' in c)) return null;
      hold(fd!, c.ino);
      return c.ino;
    },
    released(ino: bigint | null): void {
      if (ino !== null && attached) drop(ino);
    },
    detach: () => void (attached = false),
  };
}
