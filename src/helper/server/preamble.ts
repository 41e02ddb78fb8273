/** A connection whose protocol is not known yet: read until its first four bytes choose it; freeze()/thaw() for a restart. */
import type net from 'node:net';
import { peerHungUp, socketFd } from '../../os/libc/sockets.js';
import { classifyPreamble } from '../../protocol/legacy.js';
import type { Freezable } from '../handover/frozen.js';
import { streamReading } from '../legacy/legacy-session.js';
import type { IncompleteHold, Unread } from './incomplete-frames.js';

interface PreambleOptions {
  socket: net.Socket;
  hold: IncompleteHold;
  /** The first bytes are over the incomplete-frame budget: closes the connection. */
  overBudget(): void;
  /** The protocol is known: `head` holds every byte read so far, the magic or a request's start first. */
  decided(kind: 'v2' | 'legacy', head: Buffer): void;
}

export class Preamble implements Freezable, Unread {
  readonly kind = 'undecided' as const;
  private head: Buffer = Buffer.alloc(0);
  private readonly reading: ReturnType<typeof streamReading>;
  /** The protocol is known (or the connection closed by its first bytes): no longer undecided. */
  decided = false;
  /** Reading stopped for a restart: the incomplete-frame budget must not start it (thaw does). */
  private frozen = false;
  private wasReading = false;

  constructor(private readonly o: PreambleOptions) {
    this.reading = streamReading(o.socket, (c) => this.push(c));
  }

  socket(): net.Socket {
    return this.o.socket;
  }

  freeze(): Buffer {
    this.frozen = true;
    this.wasReading = this.o.socket.readableFlowing === true;
    return Buffer.concat([this.head, ...this.reading.freeze()]);
  }

  thaw(): void {
    this.frozen = false;
    this.reading.thaw(() => this.decided, this.wasReading);
  }

  // Unread: the connection as the incomplete-frame budget starts and watches it.
  get hold(): IncompleteHold {
    return this.o.hold;
  }

  resume(): void {
    if (this.frozen) this.wasReading = true;
    else this.o.socket.resume();
  }

  destroy(): void {
    this.o.socket.destroy();
  }

  get destroyed(): boolean {
    return this.o.socket.destroyed;
  }

  hungUp(): boolean {
    const fd = socketFd(this.o.socket);
    return fd !== undefined && peerHungUp(fd);
  }

  /** Bytes read (or received before: a handed-over connection's). */
  push(chunk: Buffer): void {
    this.head = this.head.length === 0 ? chunk : Buffer.concat([this.head, chunk]);
    const kind = classifyPreamble(this.head);
    if (kind === 'need-more') {
      if (!this.o.hold.set(this.head.length)) this.o.overBudget();
      return;
    }
    this.o.hold.set(0);
    this.reading.stop();
    this.decided = true;
    this.o.decided(kind, this.head);
  }
}
