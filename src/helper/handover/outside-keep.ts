/** What the serving process keeps outside itself against a crash (docs/daemon.md "Crashes"): each connection, the latest checkpoint. */
import fs from 'node:fs';
import { closeFd } from '../../os/libc/fds.js';
import { writeSealedMemfd, writeStateMemfd } from '../../state/memfd.js';
import type { StateSnapshot } from '../../state/snapshot.js';
import { keeperLink } from '../../keeper/link.js';
import { KEEPER_MESSAGE, KEPT_NAMES } from '../../keeper/keeper-messages.js';
import { monotonicNs } from '../../sampling/tick-loop.js';
import type { LogSink } from '../../logging/logger.js';

/** What the fd store is reached through (lifecycle/systemd.ts's Notifier). */
export interface StoreNotifier {
  readonly socket: string | undefined;
  storeFds(name: string, fds: readonly number[], opts?: { poll?: boolean }): boolean;
  removeStoredFds(name: string): void;
}

/** Who holds connections and records outside this process: `store` takes a record (a sealed memfd), false when it did not. */
interface Holder {
  readonly holder: 'keeper' | 'fd store';
  hold(fd: number, ino: bigint): void;
  drop(ino: bigint): void;
  store(record: number): boolean;
  ready(): void;
  /** The event loop turns (lifecycle/loop-watchdog.ts). */
  beat(): void;
}

export type OutsideKeep = ReturnType<typeof outside>;

/** The holder this process has (its keeper, else systemd's fd store), or null: a crash loses the connections. `found`: what the start took. */
export function outsideKeep(
  notifier: StoreNotifier,
  found: { checkpointNames: readonly string[]; restoringMark: boolean; crash: object | null; state?: Buffer },
  log: LogSink<'warn'>,
): OutsideKeep | null {
  const send = keeperLink(log);
  // The keeper drops a checkpoint it passed to a process that dies before sending its own: no restoring mark.
  if (send !== null)
    return outside({
      holder: 'keeper',
      hold: (fd) => send(KEEPER_MESSAGE.hold, '', fd),
      drop: (ino) => send(KEEPER_MESSAGE.drop, String(ino)),
      store: (fd) => send(KEEPER_MESSAGE.checkpoint, '', fd),
      ready: () => send(KEEPER_MESSAGE.ready),
      beat: () => send(KEEPER_MESSAGE.beat),
    });
  if (notifier.socket === undefined || process.env.FDSTORE === '0') return null;
  // The fd store: FDSTORE=1 under KEPT_NAMES, FDSTOREREMOVE=1 at close; its checkpoints oldest first (the latest stays).
  const checkpoints = [...found.checkpointNames];
  let marked = found.restoringMark;
  if (found.crash !== null && found.state !== undefined) {
    // A process that dies before its own first checkpoint crashed restoring this one.
    const fd = writeSealedMemfd(KEPT_NAMES.restoring, Buffer.alloc(1));
    marked = notifier.storeFds(KEPT_NAMES.restoring, [fd], { poll: false });
    closeFd(fd);
  }
  return outside({
    holder: 'fd store',
    hold: (fd, ino) => notifier.storeFds(`${KEPT_NAMES.connectionPrefix}${ino}`, [fd]),
    drop: (ino) => notifier.removeStoredFds(`${KEPT_NAMES.connectionPrefix}${ino}`),
    store(fd) {
      // A name per checkpoint, ordered: FDSTOREREMOVE=1 removes every fd of a name, so the new one is
      // stored before the old one goes, and a crash between the two leaves both (the next start takes the latest).
      const name = `${KEPT_NAMES.checkpointPrefix}${monotonicNs()}`;
      if (!notifier.storeFds(name, [fd], { poll: false })) return false;
      for (const old of checkpoints.splice(0, checkpoints.length, name)) notifier.removeStoredFds(old);
      if (marked) notifier.removeStoredFds(KEPT_NAMES.restoring);
      marked = false;
      return true;
    },
    ready: () => {},
    beat: () => {},
  });
}

/** `h` seeing each connection (named by its socket's inode, as the keeper names it) until detach(), and each checkpoint. */
function outside(h: Holder) {
  let attached = true;
  return {
    ...h,
    /** Holds the connection of socket fd `fd`, just accepted or adopted (checked then: its inode is all to learn); names it for released(). */
    held(fd: number | undefined): bigint | null {
      if (fd === undefined || !attached) return null;
      const ino = fs.fstatSync(fd, { bigint: true }).ino;
      h.hold(fd, ino);
      return ino;
    },
    released(ino: bigint | null): void {
      if (ino !== null && attached) h.drop(ino);
    },
    /** From now on, closing connections (a stop, a hand-over) leaves them held. */
    detach: () => void (attached = false),
    /** Hands the holder the latest checkpoint (the one before is let go). */
    checkpoint(s: StateSnapshot): void {
      const fd = writeStateMemfd(s);
      h.store(fd);
      closeFd(fd);
    },
  };
}
