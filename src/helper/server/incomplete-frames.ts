/**
 * Frames (v2) or requests (legacy) not fully arrived, kept as they come (never sized by a length field), bounded in total and time,
 * shared by uids (docs/daemon.md "What other users cannot delay"). A refused chunk is garbage until collected: read only if one fits.
 */

import { ownerToEvict } from '../../budget/uid-share.js';
import { runInSlices } from '../../sampling/time-slices.js';
import { DEFAULT_INCOMPLETE_LIMITS } from './listener.js';

/** The most one socket read delivers (libuv reads 64 KiB at a time). */
export const READ_CHUNK = 64 * 1024;

/** Why a connection's incomplete frame was cut: what a v2 client is told (ERROR 4), and what is logged. */
export const CUT_REASON = {
  deadline: 'frame incomplete past the deadline; send each frame whole',
  evicted: 'the helper holds too many incomplete frames and your user holds the most of them; send each frame whole and retry',
} as const;
export type CutReason = keyof typeof CUT_REASON;

/** A connection not read yet (a paused net.Socket). */
export interface Unread {
  resume(): void;
  destroy(): void;
  readonly destroyed: boolean;
  /** The client has closed already: what it left is not worth reading. */
  hungUp(): boolean;
  /** Its account, and its user's (the hold's uid). */
  readonly hold: IncompleteHold;
}

/** What one user (uid) holds: bytes, the holds with bytes (oldest incomplete frame first), connections waiting. */
interface UserAccount {
  bytes: number;
  holds: Set<IncompleteHold>;
  waiting: Set<Unread>;
}

export class IncompleteFrames {
  heldBytes = 0;
  /**
   * A chunk for each connection started reading whose first bytes have not come (IncompleteHold.promise): a turn may start
   * many (the listener accepts up to 32), and each must still find its chunk's room when its bytes come.
   */
  promisedBytes = 0;
  /** Holds past their deadline, cut in slices (time-slices.ts): thousands of frames started together expire together. */
  private readonly expiring: { h: IncompleteHold; frame: number }[] = [];
  private readonly users = new Map<number, UserAccount>();
  /** Making room: no waiting connection is resumed meanwhile (the room is for the one asking). */
  private makingRoom = false;

  constructor(readonly limits: typeof DEFAULT_INCOMPLETE_LIMITS = DEFAULT_INCOMPLETE_LIMITS) {}

  heldBy(uid: number): number {
    return this.users.get(uid)?.bytes ?? 0;
  }

  get waitingConnections(): number {
    let n = 0;
    for (const u of this.users.values()) n += u.waiting.size;
    return n;
  }

  /** Starts reading a new (paused) connection now if there is room for a chunk and none of its user's waits; else queues it: false. */
  startReading(c: Unread): boolean {
    const uid = c.hold.uid;
    const u = this.user(uid);
    if (u.waiting.size === 0 && this.makeRoom(uid, READ_CHUNK)) {
      start(c);
      return true;
    }
    u.waiting.add(c);
    return false;
  }

  forget(c: Unread): void {
    const uid = c.hold.uid;
    const u = this.users.get(uid);
    if (u === undefined) return;
    u.waiting.delete(c);
    this.dropIfEmpty(uid, u);
  }

  /** @internal A hold's bytes go from `before` to `after` (`kept`: its promised chunk is given back); false when the total is now past maxBytes. */
  adjust(h: IncompleteHold, before: number, after: number, kept = false): boolean {
    const u = this.user(h.uid);
    if (after > before) this.makeRoom(h.uid, after - before);
    this.heldBytes += after - before;
    u.bytes += after - before;
    if (after === 0) u.holds.delete(h);
    else if (before === 0) u.holds.add(h);
    if ((after < before || kept) && !this.makingRoom) this.drain();
    this.dropIfEmpty(h.uid, u);
    return this.heldBytes <= this.limits.maxBytes;
  }

  /** @internal A hold's deadline passed: it is cut in a slice, unless its frame `frame` completed meanwhile. */
  expire(h: IncompleteHold, frame: number): void {
    // Cutting while the queue is not empty: emptied once the cuts are done.
    if (this.expiring.push({ h, frame }) > 1) return;
    void runInSlices(this.expiring.values(), ({ h, frame }) => h.expireNow(frame)).finally(() => (this.expiring.length = 0));
  }

  private room(): number {
    return this.limits.maxBytes - this.heldBytes - this.promisedBytes;
  }

  private user(uid: number): UserAccount {
    let u = this.users.get(uid);
    if (u === undefined) this.users.set(uid, (u = { bytes: 0, holds: new Set(), waiting: new Set() }));
    return u;
  }

  private dropIfEmpty(uid: number, u: UserAccount): void {
    if (u.bytes === 0 && u.holds.size === 0 && u.waiting.size === 0) this.users.delete(uid);
  }

  /** @internal Room for `need` more bytes of `uid`: the oldest frames of the heaviest user cut while it holds more than `uid` would. */
  makeRoom(uid: number, need: number): boolean {
    if (this.room() >= need) return true;
    const was = this.makingRoom;
    this.makingRoom = true;
    try {
      while (this.room() < need) {
        const holders = [...this.users.values()].filter((acc) => acc.holds.size > 0);
        const heaviest = ownerToEvict(holders, (acc) => acc.bytes, this.users.get(uid) ?? null, this.heldBy(uid) + need);
        if (heaviest === undefined) break;
        const [oldest] = heaviest.holds;
        oldest!.cut('evicted');
      }
    } finally {
      this.makingRoom = was;
    }
    if (!was) this.drain(need);
    return this.room() >= need;
  }

  /** Resumes waiting connections, one user after another, as many as the room (less `reserved`) has chunks for. */
  private drain(reserved = 0): void {
    let chunks = Math.floor((this.room() - reserved) / READ_CHUNK);
    while (chunks > 0) {
      let resumed = false;
      for (const [uid, u] of [...this.users]) {
        if (chunks <= 0) break;
        for (const c of u.waiting) {
          u.waiting.delete(c);
          if (c.destroyed) continue;
          if (c.hungUp()) {
            c.destroy();
            continue;
          }
          chunks--;
          resumed = true;
          start(c);
          break;
        }
        this.dropIfEmpty(uid, u);
      }
      if (!resumed) return;
    }
  }
}

/** Reads `c` from now on, a chunk of the budget promised to it until its first bytes. */
function start(c: Unread): void {
  c.hold.promise();
  c.resume();
}

/** One connection's account; `close` is called once its frame is cut, after `notify` (the server's log). */
export class IncompleteHold {
  private bytes = 0;
  private timer: NodeJS.Timeout | undefined;
  /** Counts the frames this connection started holding: a deadline is for the frame it was set for. */
  private frame = 0;
  /** Started reading, its first bytes not come: a chunk counted in the owner's promisedBytes. */
  private promised = false;

  constructor(
    private readonly owner: IncompleteFrames,
    private close: (why: CutReason) => void,
    /** The peer's: whose share of the budget it uses. */
    readonly uid = 0,
    private readonly notify?: (why: CutReason) => void,
  ) {}

  /** Replaces how the connection is closed when its frame is cut (the v2 service sends an ERROR first). */
  onExpire(cb: (why: CutReason) => void): void {
    this.close = cb;
  }

  /** Now `bytes` held (0: none), timed from the first byte (a byte-a-second sender is cut off all the same); false: past maxBytes. */
  set(bytes: number): boolean {
    const kept = this.promised;
    if (kept) {
      this.promised = false;
      this.owner.promisedBytes -= READ_CHUNK;
    }
    const before = this.bytes;
    if (bytes === 0 && before === 0 && !kept) return true; // nothing held before or now (most calls): nothing to account
    this.bytes = bytes;
    const ok = this.owner.adjust(this, before, bytes, kept);
    if (bytes === 0) {
      clearTimeout(this.timer);
      this.timer = undefined;
    } else if (this.timer === undefined) {
      const frame = ++this.frame;
      this.timer = setTimeout(() => {
        this.timer = undefined;
        this.owner.expire(this, frame);
      }, this.owner.limits.deadlineMs);
      this.timer.unref();
    }
    return ok || bytes === 0;
  }

  /** @internal Started reading: a chunk is promised to it until its first bytes, or its close, set() what it holds. */
  promise(): void {
    if (this.promised) return;
    this.promised = true;
    this.owner.promisedBytes += READ_CHUNK;
  }

  /** Whether holding `bytes` (instead of what is held now) would stay within the total (room is made from a user holding more). */
  fits(bytes: number): boolean {
    if (bytes > this.bytes) this.owner.makeRoom(this.uid, bytes - this.bytes);
    return this.owner.heldBytes - this.bytes + bytes <= this.owner.limits.maxBytes;
  }

  /** @internal The deadline of `frame` passed: cut, unless that frame completed (or the connection closed) meanwhile. */
  expireNow(frame: number): void {
    if (this.bytes === 0 || frame !== this.frame) return;
    try {
      this.notify?.('deadline');
      this.close('deadline');
    } catch {
      /* a close that throws must not stop the other cuts; the connection's own error path logs it */
    }
  }

  /** @internal Evicted for a user holding less: its bytes leave the total now, then the connection is cut. */
  cut(why: CutReason): void {
    this.set(0);
    this.notify?.(why);
    this.close(why);
  }
}
