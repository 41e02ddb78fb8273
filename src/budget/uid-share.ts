/**
 * One uid may not crowd out the others: the share rule for what the daemon hands out to the
 * processes it samples (discovery slots, kept file descriptors). A preferred owner (root, or a
 * process in the socket's group: every QEMU the host runs for its users) is bound only by the
 * capacity; any other uid may hold at most UID_SHARE of it, and all such uids together at most
 * OTHERS_SHARE, so preferred owners always find at least the rest. docs/security.md, "Fakes filling
 * the discovery cap and the fd budget".
 *
 * And when a capacity shared by owners is full, who gives way (ownerToEvict): the owner holding the
 * most, its oldest item that may go, and only while it holds more than the asker would with the room
 * (max-min fairness). The daemon's connection seats and incomplete-frame budget and the exporter's
 * connection slots evict by this rule.
 */

/** The part of a capacity one uid that is not a preferred owner may hold. */
export const UID_SHARE = 1 / 4;
/** The part of a capacity all uids that are not preferred owners may hold together. */
export const OTHERS_SHARE = 1 / 2;

/** Who holds: a uid, and whether it is a preferred owner. */
export interface ShareOwner {
  uid: number;
  preferred: boolean;
}

/** Which bound a request met: the capacity itself, the uid's share, or the others' share. */
export type ShareBound = 'capacity' | 'uid' | 'others';

/** How much `owner` may still take of `capacity`, and the bound that decides it. */
export interface ShareRoom {
  room: number;
  bound: ShareBound;
}

/** What one uid, or every uid that is not a preferred owner, may hold of `capacity` (at least 1 when capacity > 0). */
export function shareOf(capacity: number, part: number): number {
  return capacity <= 0 ? 0 : Math.max(1, Math.floor(capacity * part));
}

/**
 * The owner that gives way for `asker`, who would hold `wants` with the room it asks for: of the
 * `candidates` (owners holding something that may go), the one holding the most (by `held`; among
 * equals, the first), if it holds more than `wants`; else undefined (no one holds more: no eviction).
 * The caller then evicts that owner's oldest item.
 */
export function ownerToEvict<K>(candidates: Iterable<K>, held: (owner: K) => number, asker: K | null, wants: number): K | undefined {
  let most: K | undefined;
  let mostHeld = -Infinity;
  for (const k of candidates) {
    if (k === asker) continue;
    const h = held(k);
    if (h > mostHeld) [most, mostHeld] = [k, h];
  }
  return mostHeld > wants ? most : undefined;
}

/** What is held, and by whom: a tally per uid. Holds only uids holding something (no growth past the holders). */
export class UidShares {
  private readonly byUid = new Map<number, number>();
  private totalHeld = 0;
  private othersHeld = 0;

  constructor(readonly capacity: number) {
    if (!Number.isSafeInteger(capacity) || capacity < 0) throw new RangeError(`capacity must be a whole number >= 0, got ${capacity}`);
  }

  get total(): number {
    return this.totalHeld;
  }

  /** Held by uids that are not preferred owners. */
  get others(): number {
    return this.othersHeld;
  }

  heldBy(uid: number): number {
    return this.byUid.get(uid) ?? 0;
  }

  /** What `owner` may still take, and which bound decides it (the smallest). */
  room(owner: ShareOwner): ShareRoom {
    let best: ShareRoom = { room: this.capacity - this.totalHeld, bound: 'capacity' };
    if (!owner.preferred) {
      const uid = shareOf(this.capacity, UID_SHARE) - this.heldBy(owner.uid);
      if (uid < best.room) best = { room: uid, bound: 'uid' };
      const others = shareOf(this.capacity, OTHERS_SHARE) - this.othersHeld;
      if (others < best.room) best = { room: others, bound: 'others' };
    }
    return { room: Math.max(0, best.room), bound: best.bound };
  }

  /**
   * Takes up to `n` for `owner`; returns what it got (0 when its share or the capacity is full), and
   * never less than `atLeast` (what must be had whatever the shares: counted all the same).
   */
  take(owner: ShareOwner, n: number, atLeast = 0): number {
    const got = Math.max(0, Math.min(n, Math.max(atLeast, this.room(owner).room)));
    if (got > 0) this.add(owner, got);
    return got;
  }

  /** Gives back `n` that `owner` held (never below 0). */
  give(owner: ShareOwner, n: number): void {
    const held = this.heldBy(owner.uid);
    const back = Math.min(n, held);
    if (back <= 0) return;
    this.add(owner, -back);
  }

  private add(owner: ShareOwner, n: number): void {
    const held = this.heldBy(owner.uid) + n;
    if (held <= 0) this.byUid.delete(owner.uid);
    else this.byUid.set(owner.uid, held);
    this.totalHeld += n;
    if (!owner.preferred) this.othersHeld += n;
  }
}
