/**
 * The connection slots (--max-connections) shared between users (the peer's uid from SO_PEERCRED):
 * when they are all taken and a user holding fewer connections than another needs one, a connection
 * of the user holding the most that has not been read yet (its protocol not known: waiting for the
 * incomplete-frame budget, or its first bytes not in) is closed, the oldest first. Connections being
 * served (QEMU's legacy session, a v2 client past its magic) are never closed for another user.
 */

/** One connection's slot: told when its protocol is known, released at close. */
export interface Seat {
  /** The protocol is known: the connection is served from now on, no longer closed for another user. */
  decided(): void;
  /** The connection closed. Idempotent. */
  release(): void;
}

interface UserSeats {
  count: number;
  /** Connections not read yet, oldest first, each with how to close it. */
  undecided: Set<() => void>;
}

export class ConnectionSeats {
  private readonly users = new Map<number, UserSeats>();

  /** Connections of `uid` open now. */
  of(uid: number): number {
    return this.users.get(uid)?.count ?? 0;
  }

  /** A new connection of `uid`; `evict` closes it if another user needs its slot while it is not decided. */
  seat(uid: number, evict: () => void): Seat {
    const u = this.user(uid);
    u.count++;
    u.undecided.add(evict);
    let released = false;
    return {
      decided: () => void u.undecided.delete(evict),
      release: () => {
        if (released) return;
        released = true;
        u.undecided.delete(evict);
        u.count--;
        if (u.count === 0) this.users.delete(uid);
      },
    };
  }

  /**
   * All slots are taken and `uid` wants one: closes the oldest undecided connection of the user
   * holding the most connections, if that user holds more than `uid` would. True when a connection
   * was closed (its slot frees at its close, so the new one may be served meanwhile).
   */
  makeRoomFor(uid: number): boolean {
    const wants = this.of(uid) + 1;
    let heaviest: UserSeats | undefined;
    for (const [other, u] of this.users) {
      if (other === uid || u.undecided.size === 0) continue;
      if (heaviest === undefined || u.count > heaviest.count) heaviest = u;
    }
    if (heaviest === undefined || heaviest.count <= wants) return false;
    const [oldest] = heaviest.undecided;
    heaviest.undecided.delete(oldest!);
    oldest!();
    return true;
  }

  private user(uid: number): UserSeats {
    let u = this.users.get(uid);
    if (u === undefined) this.users.set(uid, (u = { count: 0, undecided: new Set() }));
    return u;
  }
}
