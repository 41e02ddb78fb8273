/** One legacy connection (docs/protocol.md): a chunk's replies sent at once, read past Node's stream layer where this Node allows it. */
import net from 'node:net';
import os from 'node:os';
import { errnoError } from '../../os/libc/errno.js';
import { recvNow, sendNow, socketFd, type PeerCredentials } from '../../os/libc/sockets.js';
import { LEGACY_REPLY_SIZE, LegacyFramer } from '../../protocol/legacy.js';
import { listen } from '../../common/disposable.js';
import { drainReadable, type Freezable } from '../handover/frozen.js';
import type { LegacyService } from './legacy-service.js';
import type { TidVerdicts } from './tid-verdicts.js';

/** A client that pipelines without reading is not read while this many reply bytes wait for it (default). */
export const DEFAULT_MAX_PENDING_REPLY_BYTES = 64 * 1024;

interface LegacySessionOptions {
  /** The connection as accepted (or adopted), and the bytes read of it so far (its first request's start). */
  socket: net.Socket;
  first: Buffer;
  peer: PeerCredentials;
  legacy: LegacyService;
  hold: { set(bytes: number): boolean };
  /** Where replies are written before they are sent (shared: one connection at a time). */
  replies: Buffer;
  /** Told of each read and each chunk's replies: it may poll for the next request at the turn's end (server/busy-poll.ts). */
  busyPoll: { arrived(): void; replied(connection: LegacySession): void };
  /** Incomplete requests of all clients hold more than the budget: closes `socket`. */
  overBudget(socket: net.Socket): void;
  /** The session ended by a refused request: it is no longer one to hand over. */
  ended(session: LegacySession): void;
}

type Reading = Pick<Freezable, 'freeze' | 'thaw'> & { stop(): void };

export class LegacySession implements Freezable {
  readonly kind = 'legacy' as const;
  private readonly framer = new LegacyFramer();
  private readonly verdicts: TidVerdicts;
  private closing = false;
  /** Reading stopped for a restart: a drained backlog must not start it again (thaw does). */
  private frozen = false;
  private reading: Reading | undefined;
  /** Read into READ_BUFFER past the stream layer (readIntoBuffer), so readNow may read it too. */
  private fast = false;

  constructor(private readonly o: LegacySessionOptions) {
    this.verdicts = o.legacy.verdictsFor(o.peer.pid);
  }

  /** Serves the connection from its first bytes on; false when it ended at once (a refused request). */
  start(): boolean {
    const socket = this.o.socket;
    this.onData(this.o.first);
    if (this.closing) return false;
    // Bytes the stream read past `first` and holds (none, usually) come before the rest.
    socket.pause();
    for (let rest: Buffer | null; !this.closing && (rest = socket.read() as Buffer | null) !== null;) this.onData(rest);
    if (this.closing) return false;
    this.fast = readIntoBuffer(socket, (c) => this.onData(c));
    this.reading = this.fast ? this.readFast(socket) : this.readStream(socket);
    return true;
  }

  socket(): net.Socket {
    return this.o.socket;
  }

  fd(): number | undefined {
    return socketFd(this.o.socket);
  }

  /** Reads and answers what the connection has now, past the loop (the busy poll saw it ready alone); false: nothing read. */
  readNow(): boolean {
    const fd = this.fast && !this.closing && !this.frozen && !this.o.socket.isPaused() ? this.fd() : undefined;
    const n = fd === undefined ? 0 : recvNow(fd, READ_BUFFER);
    if (n <= 0) return false; // the end of the stream or an error: the loop's read sees it too, and closes
    this.onData(READ_BUFFER.subarray(0, n));
    return true;
  }

  freeze(): Buffer {
    this.frozen = true;
    return this.reading?.freeze() ?? Buffer.from(this.framer.incomplete);
  }

  thaw(): void {
    this.frozen = false;
    this.reading?.thaw();
  }

  private onData(chunk: Buffer): void {
    if (this.closing) return;
    const socket = this.o.socket;
    this.o.busyPoll.arrived();
    const reqs = this.framer.push(chunk);
    if (reqs.length > 0) {
      const size = reqs.length * LEGACY_REPLY_SIZE;
      const out = size <= this.o.replies.length ? this.o.replies : Buffer.allocUnsafe(size);
      for (let i = 0; i < reqs.length; i++) {
        if (this.o.legacy.answer(this.o.peer, reqs[i]!, this.verdicts, out, i * LEGACY_REPLY_SIZE)) continue;
        this.refused(socket, out, i * LEGACY_REPLY_SIZE);
        return;
      }
      sendReplies(socket, out, size);
      this.o.legacy.afterReplies();
      this.o.busyPoll.replied(this);
    }
    if (!this.o.hold.set(this.framer.incomplete.length)) return this.o.overBudget(socket);
    // A client that pipelines without reading waits for itself, not the helper's memory.
    if (socket.writableLength > DEFAULT_MAX_PENDING_REPLY_BYTES && !socket.isPaused()) {
      socket.pause();
      socket.once('drain', () => this.frozen || socket.resume());
    }
  }

  private refused(socket: net.Socket, out: Buffer, answered: number): void {
    this.closing = true;
    this.o.ended(this);
    this.reading?.stop();
    if (answered > 0) sendReplies(socket, out, answered);
    this.o.legacy.afterReplies();
    socket.end(); // replies already queued still go out, in order
    setTimeout(() => socket.destroy(), 1000).unref();
  }

  private readFast(fast: net.Socket): Reading {
    fast.resume();
    return {
      stop: () => fast.pause(),
      freeze: () => {
        fast.pause();
        return Buffer.from(this.framer.incomplete);
      },
      thaw: () => {
        if (fast.writableLength <= DEFAULT_MAX_PENDING_REPLY_BYTES) fast.resume();
        else fast.once('drain', () => this.frozen || fast.resume());
      },
    };
  }

  /** A Node without `onread` keys: served through the stream. */
  private readStream(socket: net.Socket): Reading {
    const reading = streamReading(socket, (c) => this.onData(c));
    socket.resume();
    return {
      stop: reading.stop,
      freeze: () => Buffer.concat([this.framer.incomplete, ...reading.freeze()]),
      thaw: () => reading.thaw(() => this.closing, true),
    };
  }
}

/** Reads `socket` through its stream; freeze() stops it and returns what the stream read ahead, which thaw() hands on first. */
export function streamReading(socket: net.Socket, onData: (c: Buffer) => void) {
  let data = listen(socket, 'data', onData);
  let readAhead: Buffer[] = [];
  return {
    stop: () => data.dispose(),
    freeze: (): Buffer[] => {
      data.dispose();
      socket.pause();
      return (readAhead = drainReadable(socket));
    },
    /** Reads again, the read-ahead first, each chunk unless `ended`; `resume`: the socket resumed too. */
    thaw: (ended: () => boolean, resume: boolean) => {
      data = listen(socket, 'data', onData);
      for (const c of readAhead.splice(0)) if (!ended()) onData(c);
      if (resume && !ended()) socket.resume();
    },
  };
}

/** Where every legacy connection reads: one buffer, each read handled synchronously before the next. */
const READ_BUFFER = Buffer.allocUnsafe(64 * 1024);

/**
 * Node's keys (symbols) of a socket's `onread` mode: found by value on a socket made with the option; null if this Node has none.
 * Found at the first legacy connection, not at load: the probe socket is the process's first, and would cost the start-up its code.
 */
let onreadKeys: { buffer: symbol; callback: symbol } | null | undefined;
function findOnreadKeys(): { buffer: symbol; callback: symbol } | null {
  const callback = () => true;
  const probe = new net.Socket({ onread: { buffer: READ_BUFFER, callback } } as net.SocketConstructorOpts) as unknown as Record<
    symbol,
    unknown
  >;
  const key = (value: unknown) => Object.getOwnPropertySymbols(probe).find((k) => probe[k] === value);
  const [buffer, cb] = [key(READ_BUFFER), key(callback)];
  return buffer !== undefined && cb !== undefined ? { buffer, callback: cb } : null;
}

/**
 * From now on `socket` hands each read to `onChunk` (valid during the call only), as a socket created with `onread` does: that
 * skips the stream layer (most of a round trip's user-space time), and Node offers it only from the constructor, so the keys
 * it sets are set here, and the handle reads into READ_BUFFER. False (nothing changed) when this Node lacks either.
 */
export function readIntoBuffer(socket: net.Socket, onChunk: (chunk: Buffer) => void): boolean {
  const handle = (socket as unknown as { _handle?: { useUserBuffer?: (b: Uint8Array) => void } })._handle;
  const keys = (onreadKeys ??= findOnreadKeys());
  if (keys === null || typeof handle?.useUserBuffer !== 'function') return false;
  const s = socket as unknown as Record<symbol, unknown>;
  s[keys.buffer] = READ_BUFFER;
  s[keys.callback] = (n: number, buf: Uint8Array) => {
    onChunk(Buffer.from(buf.buffer, buf.byteOffset, n));
    return true; // false would pause the socket
  };
  handle.useUserBuffer(READ_BUFFER);
  return true;
}

/** Sends out[0, length): straight to the socket when the stream is empty (a write request and its tick cost more), the rest queued. */
export function sendReplies(socket: net.Socket, out: Buffer, length: number): void {
  let sent = 0;
  const fd = socket.writableLength === 0 ? socketFd(socket) : undefined;
  if (fd !== undefined) {
    const n = sendNow(fd, out, length);
    if (n === length) return;
    if (n < 0 && n !== -os.constants.errno.EAGAIN) {
      socket.destroy(errnoError('send a reply', -n));
      return;
    }
    sent = Math.max(n, 0);
  }
  socket.write(Buffer.from(out.subarray(sent, length)));
}
