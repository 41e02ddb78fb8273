/**
 * One uid may not crowd out the others: a preferred owner (root, the socket's group) is bound only by
 * the capacity, any other uid by UID_SHARE of it, all of them together by OTHERS_SHARE (docs/security.md,
 * "Fakes filling the discovery cap and the fd budget"). A full capacity's largest holder gives way (ownerToEvict).
 */

/** The part of a capacity one uid that is not a preferred owner may hold. */
export const UID_SHARE = 1 / 4;
/** The part of a capacity all uids that are not preferred owners may hold together. */
export const OTHERS_SHARE = 1 / 2;

export interface ShareOwner {
  uid: number;
  preferred: boolean;
}

/** Which bound a request met: the capacity itself, the uid's share, or the others' share. */
export type ShareBound = 'capacity' | 'uid' | 'others';

interface ShareRoom {
  room: number;
  bound: ShareBound;
}

/** What one uid, or every uid that is not a preferred owner, may hold of `capacity` (at least 1 when capacity > 0). */
export function shareOf(capacity: number, part: number): number {
  return capacity <= 0 ? 0 : Math.max(1, Math.floor(capacity * part));
}

/** Of `candidates`, the first holding the most, if more than `wants` (what `asker` would hold): max-min fairness. */
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

/** A tally per uid, of the uids holding something only. */
export class UidShares {
  private readonly byUid = new Map<number, number>();
  private totalHeld = 0;
  private othersHeld = 0;

  constructor(readonly capacity: number) {
    if (!Number.isSafeInteger(capacity) || capacity < 0) throw new RangeError(`capacity must be a whole number >= 0, got ${capacity}`);
  }

  /** Held by uids that are not preferred owners. */
  get others(): number {
    return this.othersHeld;
  }

  heldBy(uid: number): number {
    return this.byUid.get(uid) ?? 0;
  }

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

  /** Takes up to `n` for `owner`, and never less than `atLeast` (had whatever the shares); returns what it got. */
  take(owner: ShareOwner, n: number, atLeast = 0): number {
    const got = Math.max(0, Math.min(n, Math.max(atLeast, this.room(owner).room)));
    if (got > 0) this.add(owner, got);
    return got;
  }

  give(owner: ShareOwner, n: number): void {
    const back = Math.min(n, this.heldBy(owner.uid));
    if (back > 0) this.add(owner, -back);
  }

  private add(owner: ShareOwner, n: number): void {
    const held = this.heldBy(owner.uid) + n;
    if (held <= 0) this.byUid.delete(owner.uid);
    else this.byUid.set(owner.uid, held);
    this.totalHeld += n;
    if (!owner.preferred) this.othersHeld += n;
  }
}
