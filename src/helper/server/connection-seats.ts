/**
 * The --max-connections slots shared between uids (docs/security.md "The socket's group locking QEMU out"): when full, a user
 * holding fewer takes the heaviest user's oldest undecided connection; a QEMU's first, outside the shares, its oldest non-QEMU one.
 */
import { ownerToEvict, UidShares, type ShareOwner } from '../../budget/uid-share.js';

export interface Seat {
  /** The protocol is known: the connection is served from now on, no longer closed for another user. */
  decided(): void;
  release(): void;
}

export class ConnectionSeats {
  /** The connections each uid holds, served ones too, against its share of the slots (QEMU's outside). */
  readonly shares: UidShares;
  /** Per uid holding any: its connections not read yet, oldest first, each with how to close it. */
  private readonly undecided = new Map<number, Set<() => void>>();
  /** Per uid holding any: every connection of it that is not QEMU's, oldest first (what a QEMU may close). */
  private readonly notQemu = new Map<number, Set<() => void>>();
  /** The QEMU processes holding their seat first in line. */
  private readonly qemuPids = new Set<number>();

  constructor(readonly capacity: number) {
    this.shares = new UidShares(capacity);
  }

  /** Whether a connection of QEMU process `pid` would be QEMU's first in line (it holds none yet). */
  qemuFirst(pid: number): boolean {
    return !this.qemuPids.has(pid);
  }

  /** A new connection of `owner`; `evict` closes it if another user, or QEMU, needs its slot. `qemuPid`: QEMU's first, outside the shares. */
  seat(owner: ShareOwner, evict: () => void, qemuPid?: number): Seat {
    if (qemuPid !== undefined) this.qemuPids.add(qemuPid);
    else {
      this.shares.take(owner, 1, 1);
      this.listOf(this.undecided, owner.uid).add(evict);
      this.listOf(this.notQemu, owner.uid).add(evict);
    }
    let released = false;
    return {
      decided: () => void this.undecided.get(owner.uid)?.delete(evict),
      release: () => {
        if (released) return;
        released = true;
        if (qemuPid !== undefined) {
          this.qemuPids.delete(qemuPid);
          return;
        }
        this.drop(this.undecided, owner.uid, evict);
        this.drop(this.notQemu, owner.uid, evict);
        this.shares.give(owner, 1);
      },
    };
  }

  /** All slots taken and `uid` wants one: closes the oldest undecided connection of the user holding the most, if more than `uid` would. */
  makeRoomFor(uid: number): boolean {
    const candidates = [...this.undecided].filter(([, undecided]) => undecided.size > 0).map(([other]) => other);
    const heaviest = ownerToEvict(candidates, (other) => this.shares.heldBy(other), uid, this.shares.heldBy(uid) + 1);
    return heaviest !== undefined && this.evictOldest(this.undecided, heaviest);
  }

  /** All slots taken and a QEMU wants its first: closes the oldest non-QEMU connection of the user holding the most; false: all are QEMU's. */
  makeRoomForQemu(): boolean {
    const uid = ownerToEvict(this.notQemu.keys(), (u) => this.notQemu.get(u)!.size, null, 0);
    return uid !== undefined && this.evictOldest(this.notQemu, uid);
  }

  /** Out of both lists now (its close releases it later): no second eviction picks it again. */
  private evictOldest(from: Map<number, Set<() => void>>, uid: number): true {
    const [oldest] = from.get(uid)!;
    this.drop(this.notQemu, uid, oldest!);
    this.drop(this.undecided, uid, oldest!);
    oldest!();
    return true;
  }

  private listOf(lists: Map<number, Set<() => void>>, uid: number): Set<() => void> {
    let u = lists.get(uid);
    if (u === undefined) lists.set(uid, (u = new Set()));
    return u;
  }

  private drop(lists: Map<number, Set<() => void>>, uid: number, evict: () => void): void {
    const u = lists.get(uid);
    if (u === undefined) return;
    u.delete(evict);
    if (u.size === 0) lists.delete(uid);
  }
}
