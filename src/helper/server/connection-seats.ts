/**
 * The connection slots (--max-connections) shared between users (the peer's uid from SO_PEERCRED):
 * each connection holds one against its uid's share (common/uid-share.ts: a user that is neither root
 * nor in --socket-group holds at most a quarter, all such users half); when they are all taken and a user holding fewer connections than another needs one, a connection
 * of the user holding the most that has not been read yet (its protocol not known: waiting for the
 * incomplete-frame budget, or its first bytes not in) is closed, the oldest first. Connections being
 * served (QEMU's legacy session, a v2 client past its magic) are never closed for another user.
 */

import { UidShares, type ShareOwner, type ShareRoom } from '../../common/uid-share.js';

/** One connection's slot: told when its protocol is known, released at close. */
export interface Seat {
  /** The protocol is known: the connection is served from now on, no longer closed for another user. */
  decided(): void;
  /** The connection closed. Idempotent. */
  release(): void;
}

export class ConnectionSeats {
  /** The connections each uid holds, served ones too, against its share of the slots. */
  private readonly shares: UidShares;
  /** Per uid holding any: its connections not read yet, oldest first, each with how to close it. */
  private readonly undecided = new Map<number, Set<() => void>>();

  constructor(readonly capacity: number) {
    this.shares = new UidShares(capacity);
  }

  /** Connections of `uid` open now. */
  heldBy(uid: number): number {
    return this.shares.heldBy(uid);
  }

  /** How many more `owner` may open, and the bound that decides it (the slots, its uid's share, or all others'). */
  room(owner: ShareOwner): ShareRoom {
    return this.shares.room(owner);
  }

  /**
   * A new connection of `owner`, counted against its share whatever room is left (the caller decided
   * to serve it); `evict` closes it if another user needs its slot while it is not decided.
   */
  seat(owner: ShareOwner, evict: () => void): Seat {
    this.shares.take(owner, 1, 1);
    const undecided = this.undecidedOf(owner.uid);
    undecided.add(evict);
    let released = false;
    return {
      decided: () => void undecided.delete(evict),
      release: () => {
        if (released) return;
        released = true;
        undecided.delete(evict);
        this.shares.give(owner, 1);
        if (this.shares.heldBy(owner.uid) === 0) this.undecided.delete(owner.uid);
      },
    };
  }

  /**
   * All slots are taken and `uid` wants one: closes the oldest undecided connection of the user
   * holding the most connections, if that user holds more than `uid` would. True when a connection
   * was closed (its slot frees at its close, so the new one may be served meanwhile).
   */
  makeRoomFor(uid: number): boolean {
    const wants = this.heldBy(uid) + 1;
    let heaviest: { held: number; undecided: Set<() => void> } | undefined;
    for (const [other, undecided] of this.undecided) {
      if (other === uid || undecided.size === 0) continue;
      const held = this.heldBy(other);
      if (heaviest === undefined || held > heaviest.held) heaviest = { held, undecided };
    }
    if (heaviest === undefined || heaviest.held <= wants) return false;
    const [oldest] = heaviest.undecided;
    heaviest.undecided.delete(oldest!);
    oldest!();
    return true;
  }

  private undecidedOf(uid: number): Set<() => void> {
    let u = this.undecided.get(uid);
    if (u === undefined) this.undecided.set(uid, (u = new Set()));
    return u;
  }
}
