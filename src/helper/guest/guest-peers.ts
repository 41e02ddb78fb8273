/**
 * The processes exact mode remembers (docs/security.md "Exact mode's peers"), by (pid, start time);
 * bounded by the share rule as discovery is; forgotten once their process has ended.
 */
import { DEFAULT_MAX_DISCOVERED_VMS } from '../../discovery/discovery-limits.js';
import { UidShares, type ShareOwner } from '../../budget/uid-share.js';
import type { Logger } from '../../logging/logger.js';

/** A process not heard from for this long is looked at: forgotten when it ended. */
const IDLE_NS = 3_000_000_000n;

export interface ProcessKey {
  pid: number;
  starttime: number;
}

interface Entry<P> {
  key: ProcessKey;
  owner: ShareOwner;
  /** The last request, or the last look that found the process alive. */
  seenNs: bigint;
  peer: P;
}

interface GuestPeersOptions<P> {
  log: Logger;
  alive(key: ProcessKey): boolean;
  /** Whether a peer may be dropped to make room (it holds no exact counters). */
  droppable(peer: P): boolean;
  forgotten(peer: P): void;
  capacity?: number;
}

export class GuestPeers<P> {
  private readonly byKey = new Map<string, Entry<P>>();
  private readonly shares: UidShares;
  private fullSaid = false;
  private sweptNs = -IDLE_NS;

  constructor(private readonly o: GuestPeersOptions<P>) {
    this.shares = new UidShares(o.capacity ?? DEFAULT_MAX_DISCOVERED_VMS);
  }

  /** The peer of process `key`, made by `make` if new; undefined when it cannot be remembered (left raw). */
  get(key: ProcessKey, ownerOf: () => ShareOwner | null, nowNs: bigint, make: () => P): P | undefined {
    const k = `${key.pid}:${key.starttime}`;
    const e = this.byKey.get(k);
    if (e !== undefined) {
      e.seenNs = nowNs;
      return e.peer;
    }
    const owner = ownerOf();
    if (owner === null || !this.room(owner, nowNs)) return undefined;
    const peer = make();
    this.shares.take(owner, 1);
    this.byKey.set(k, { key, owner, seenNs: nowNs, peer });
    return peer;
  }

  *values(): IterableIterator<P> {
    for (const e of this.byKey.values()) yield e.peer;
  }

  /** Forgets the peers not heard from for IDLE_NS whose process ended. */
  sweep(nowNs: bigint): void {
    this.sweptNs = nowNs;
    for (const [k, e] of this.byKey) {
      if (nowNs - e.seenNs < IDLE_NS) continue;
      if (this.o.alive(e.key)) e.seenNs = nowNs;
      else this.forget(k, e);
    }
  }

  private forget(k: string, e: Entry<P>): void {
    this.byKey.delete(k);
    this.shares.give(e.owner, 1);
    this.o.forgotten(e.peer);
  }

  /** Whether `owner` may have one more: after forgetting ended processes, and a droppable peer of its own (or anyone's, at the capacity). */
  private room(owner: ShareOwner, nowNs: bigint): boolean {
    if (this.shares.room(owner).room > 0) return true;
    if (nowNs - this.sweptNs >= IDLE_NS) this.sweep(nowNs);
    let r = this.shares.room(owner);
    if (r.room === 0) {
      const victim = [...this.byKey].find(([, e]) => (r.bound === 'capacity' || e.owner.uid === owner.uid) && this.o.droppable(e.peer));
      if (victim !== undefined) this.forget(...victim);
      r = this.shares.room(owner);
    }
    if (r.room > 0) return true;
    if (!this.fullSaid)
      this.o.log.warn(
        { uid: owner.uid, bound: r.bound, held: this.shares.heldBy(owner.uid), capacity: this.shares.capacity },
        `guest energy: cannot count a new QEMU process exactly: the ${r.bound === 'capacity' ? 'table of processes' : `share of ${r.bound === 'uid' ? 'this uid' : 'uids other than root and --socket-group'}`} is full of live processes; it is answered raw (said once; docs/security.md)`,
      );
    this.fullSaid = true;
    return false;
  }
}
