/**
 * What a connection may hold of a frame (v2) or request (legacy, the 4-byte preamble) that has not
 * fully arrived: bytes are kept as they come (never a buffer sized by a length field), their total
 * over all connections is bounded (maxBytes), and an incomplete frame must complete within
 * deadlineMs of its first byte, or its connection is closed. A connection idle between requests
 * holds nothing and never times out: QEMU's connection is idle most of the time.
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

export type HoldFailure = 'over budget' | 'deadline';

export class IncompleteFrames {
  private total = 0;

  constructor(readonly limits: IncompleteFrameLimits = DEFAULT_INCOMPLETE_LIMITS) {}

  /** Bytes of incomplete frames held now, all connections. */
  get heldBytes(): number {
    return this.total;
  }

  /** One connection's account; `expired` is called once its incomplete frame is past the deadline. */
  hold(expired: () => void): IncompleteHold {
    return new IncompleteHold(this, expired);
  }

  /** @internal */
  adjust(delta: number): boolean {
    this.total += delta;
    return this.total <= this.limits.maxBytes;
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

  /** The connection is gone: its bytes leave the total. Idempotent. */
  release(): void {
    this.set(0);
  }

  private stopTimer(): void {
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
  }
}
