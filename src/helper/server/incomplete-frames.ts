/**
 * What a connection may hold of a frame (v2) or request (legacy, the 4-byte preamble) that has not
 * fully arrived: bytes are kept as they come (never a buffer sized by a length field), their total
 * over all connections is bounded (maxBytes), and an incomplete frame must complete within
 * deadlineMs of its first byte, or its connection is closed. A connection idle between requests
 * holds nothing and never times out: QEMU's connection is idle most of the time.
 *
 * A socket read brings up to READ_CHUNK bytes at once, and a chunk that is refused is garbage until
 * V8 collects it: reading thousands of hostile chunks only to drop them grows RSS as surely as
 * keeping them. So a new connection is read only while the budget has room for one more chunk;
 * otherwise it waits, unread (its bytes stay in the kernel), and is read once held frames complete,
 * time out or close. Connections already being read are never paused.
 */

export interface IncompleteFrameLimits {
  /** Bytes of incomplete frames held over all connections; a connection that would go past it is closed. */
  maxBytes: number;
  /** How long one frame or request may stay incomplete, from its first byte. */
  deadlineMs: number;
}

export const DEFAULT_INCOMPLETE_LIMITS: IncompleteFrameLimits = {
  maxBytes: 16 * 1024 * 1024,
  deadlineMs: 10_000,
};

/** The most one socket read delivers (libuv reads 64 KiB at a time). */
export const READ_CHUNK = 64 * 1024;

/** A connection not read yet (a paused net.Socket). */
export interface Unread {
  resume(): void;
  destroy(): void;
  readonly destroyed: boolean;
  /** The client has closed already: what it left is not worth reading. */
  hungUp(): boolean;
}

export class IncompleteFrames {
  private total = 0;
  private readonly waiting = new Set<Unread>();

  constructor(readonly limits: IncompleteFrameLimits = DEFAULT_INCOMPLETE_LIMITS) {}

  /** Bytes of incomplete frames held now, all connections. */
  get heldBytes(): number {
    return this.total;
  }

  /** One connection's account; `expired` is called once its incomplete frame is past the deadline. */
  hold(expired: () => void): IncompleteHold {
    return new IncompleteHold(this, expired);
  }

  /** Connections accepted but not read yet, waiting for room. */
  get waitingConnections(): number {
    return this.waiting.size;
  }

  /**
   * Starts reading a new (paused) connection now if the budget has room for a chunk and nobody is
   * waiting before it; otherwise queues it and returns false.
   */
  startReading(c: Unread): boolean {
    if (this.waiting.size === 0 && this.room() >= READ_CHUNK) {
      c.resume();
      return true;
    }
    this.waiting.add(c);
    return false;
  }

  /** A connection closed: it no longer waits. */
  forget(c: Unread): void {
    this.waiting.delete(c);
  }

  /** @internal */
  adjust(delta: number): boolean {
    this.total += delta;
    if (delta < 0 && this.waiting.size > 0) this.drain();
    return this.total <= this.limits.maxBytes;
  }

  private room(): number {
    return this.limits.maxBytes - this.total;
  }

  /** Resumes waiting connections, in order, as many as the room has chunks for. */
  private drain(): void {
    let chunks = Math.floor(this.room() / READ_CHUNK);
    for (const c of this.waiting) {
      if (chunks <= 0) break;
      this.waiting.delete(c);
      if (c.destroyed) continue;
      if (c.hungUp()) {
        c.destroy();
        continue;
      }
      chunks--;
      c.resume();
    }
  }
}

export class IncompleteHold {
  private bytes = 0;
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly owner: IncompleteFrames,
    private expired: () => void,
  ) {}

  /** Replaces what happens at the deadline (the v2 service sends an ERROR before closing). */
  onExpire(cb: () => void): void {
    this.expired = cb;
  }

  /**
   * The connection now holds `bytes` of an incomplete frame (0: none). The deadline starts with the
   * first byte and is not pushed back by more bytes (a byte-a-second sender is cut off all the same).
   * False when the total over all connections is now past maxBytes: the caller closes the connection
   * (and calls release()).
   */
  set(bytes: number): boolean {
    const ok = this.owner.adjust(bytes - this.bytes);
    this.bytes = bytes;
    if (bytes === 0) this.stopTimer();
    else if (this.timer === undefined) {
      this.timer = setTimeout(() => {
        this.timer = undefined;
        this.expired();
      }, this.owner.limits.deadlineMs);
      this.timer.unref();
    }
    return ok || bytes === 0;
  }

  /** Whether holding `bytes` (instead of what is held now) would stay within the total. */
  fits(bytes: number): boolean {
    return this.owner.heldBytes - this.bytes + bytes <= this.owner.limits.maxBytes;
  }

  /** The connection is gone: its bytes leave the total. Idempotent. */
  release(): void {
    this.set(0);
  }

  private stopTimer(): void {
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
  }
}
