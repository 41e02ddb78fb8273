/**
 * One v2 client: bytes in -> frames -> requests -> replies, in order. A broken frame gets ERROR 1 and a
 * close; a bad request its ERROR (docs/protocol.md). Past `maxBacklogBytes` unread it is disconnected
 * (docs/protocol-v2.md "Limits"). A reply with fds leaves in one sendmsg once nothing is queued before it.
 */
import type net from 'node:net';
import type { Logger } from 'pino';
import type { PeerCredentials } from '../../os/libc/sockets.js';
import { CLIENT_TYPES, E, encodeError } from '../../protocol/v2/codec.js';
import { FrameDecoder, type DecodeResult } from '../../protocol/v2/frame-decoder.js';
import { DEFAULT_MAX_PENDING_REPLY_BYTES } from '../legacy/legacy-session.js';
import { parseClientFrame, type ClientRequest } from '../../protocol/v2/messages.js';
import { CUT_REASON, type IncompleteHold } from '../server/incomplete-frames.js';
import type { LogLimiter } from '../../logging/log-limiter.js';
import { cannotError } from '../../common/errors.js';
import type { Reply, SendWithFds } from './reply.js';

export interface ConnectionHost {
  readonly maxBacklogBytes: number;
  /** Replies unsent past which the client's requests wait, unread (default DEFAULT_MAX_PENDING_REPLY_BYTES, as legacy's). */
  readonly maxPendingReplyBytes?: number;
  request(conn: V2Connection, req: ClientRequest): Reply;
  /** Sends a reply that carries fds; without it such a reply closes the connection. */
  readonly sendWithFds?: SendWithFds;
  /** The connection is gone: drop its VMs. Called once. */
  closed(conn: V2Connection): void;
  /** Rate limit of what clients can make the service log. */
  readonly limiter: LogLimiter;
}

/** v2 requests answered per turn of the event loop, all connections together (legacy ones not counted): Node accepts one connection per turn (docs/security.md "The socket's group locking QEMU out"). */
const V2_REQUESTS_PER_TURN = 256;
let spent = 0;
let resetQueued = false;

/** Takes one request from this turn's budget: false when it is spent (go on in the next turn). */
function takeRequestTurn(): boolean {
  if (!resetQueued) {
    resetQueued = true;
    // Queued before the connections that run out, so they find a fresh budget when their turn comes.
    setImmediate(() => {
      spent = 0;
      resetQueued = false;
    });
  }
  if (spent >= V2_REQUESTS_PER_TURN) return false;
  spent++;
  return true;
}

/** How long a connection being closed may take to flush its last ERROR before it is destroyed. */
const CLOSE_GRACE_MS = 1000;

/** Written to learn, by its callback, when everything queued before it has left the stream. */
const NOTHING = Buffer.alloc(0);

export class V2Connection {
  private readonly decoder = new FrameDecoder(CLIENT_TYPES);
  /** Bytes read and not decoded yet, from `offset`: frames are decoded one at a time as they are handled. */
  private unparsed: Buffer = NOTHING;
  private offset = 0;
  /** The socket is paused until the bytes read are handled. */
  private paused = false;
  readonly subscriptions = new Set<number>();
  readonly domainSubscriptions = new Set<number>();
  private closing = false;
  private gone = false;
  /** Replies waiting behind a reply with fds until the stream is empty; null when none waits. */
  private waiting: Reply[] | null = null;
  private waitingBytes = 0;
  /** fail() was called while replies waited: the socket ends once they are out. */
  private endWhenSent = false;
  /** Bytes queued by the batch() running now; null outside a batch. */
  private burst: number | null = null;
  /** Bytes the last batch queued: the one sample's worth allowed on top of the limit until the next. */
  private lastBurst = 0;
  readonly log: Logger;

  constructor(
    readonly id: number,
    readonly socket: net.Socket,
    readonly peer: PeerCredentials,
    private readonly host: ConnectionHost,
    log: Logger,
    private readonly hold?: IncompleteHold,
  ) {
    this.log = log.child({ conn: id, peerPid: peer.pid, peerUid: peer.uid });
    hold?.onExpire((why) => this.fail(E.LIMIT, 0, CUT_REASON[why]));
    socket.on('data', (d: Buffer) => this.onData(d));
    socket.on('error', (e) => this.log.debug({ err: e.message }, 'v2 socket error'));
    socket.on('close', () => this.onClose());
    if (socket.destroyed) queueMicrotask(() => this.onClose());
  }

  /** Bytes that came with (after) the magic. */
  start(rest: Buffer): void {
    if (rest.length > 0) this.onData(rest);
    this.socket.resume();
  }

  /** The client can still be written to (a destroyed socket closes later; each write meanwhile makes a Node error with its stack). */
  get open(): boolean {
    return !this.closing && !this.gone && !this.socket.destroyed;
  }

  /** Queues a frame; false when the client is gone or was just disconnected for its backlog. */
  send(frame: Buffer): boolean {
    return this.sendReply({ frame });
  }

  /** Queues a reply; false when the client is gone or was just disconnected for its backlog (its fds released). */
  sendReply(reply: Reply): boolean {
    if (!this.open) return this.drop(reply);
    const backlog = this.socket.writableLength + this.waitingBytes;
    const allowance = this.burst === null ? this.lastBurst : this.burst + reply.frame.length;
    // The slow-reader rule: past the limit plus one sample's burst (the batch running now, or else the last one).
    if (backlog + reply.frame.length > this.host.maxBacklogBytes + allowance) {
      const o = { conn: this.id, peerPid: this.peer.pid, backlog, sampleBytes: allowance, limit: this.host.maxBacklogBytes };
      this.host.limiter.warn('v2 backlog', o, 'v2 client does not read its socket; disconnecting it');
      this.destroy();
      return this.drop(reply);
    }
    if (this.burst !== null) this.burst += reply.frame.length;
    if (this.waiting === null && !(hasFds(reply) && this.socket.writableLength > 0)) {
      this.put(reply);
      return true;
    }
    if (this.waiting === null) {
      this.waiting = [];
      this.afterQueued();
    }
    this.waiting.push(reply);
    this.waitingBytes += reply.frame.length;
    return true;
  }

  /** Runs `fn` corked, so one sample's UPDATEs take one system call; its bytes are one sample's burst (sendReply). */
  batch(fn: () => void): void {
    const outer = this.burst;
    if (outer === null) this.burst = 0;
    this.socket.cork();
    try {
      fn();
    } finally {
      this.socket.uncork();
      if (outer === null) {
        this.lastBurst = this.burst ?? 0;
        this.burst = null;
      }
    }
  }

  /** Sends a last ERROR, then closes. */
  fail(code: number, requestType: number, message: string): void {
    if (!this.open) return;
    const o = { conn: this.id, peerPid: this.peer.pid, code, requestType, message };
    this.host.limiter.info('v2 protocol error', o, 'v2 protocol error; closing');
    this.send(encodeError(code, requestType, message));
    this.closing = true;
    if (this.waiting !== null) this.endWhenSent = true;
    else this.socket.end();
    setTimeout(() => this.socket.destroy(), CLOSE_GRACE_MS).unref();
  }

  destroy(): void {
    this.closing = true;
    this.socket.destroy();
  }

  private onData(data: Buffer): void {
    if (!this.open) return;
    // Checked before the decoder copies anything: a refused chunk is never kept.
    if (this.hold && !this.hold.fits(this.decoder.incompleteBytes + data.length)) return this.overBudget();
    this.unparsed = this.offset < this.unparsed.length ? Buffer.concat([this.unparsed.subarray(this.offset), data]) : data;
    this.offset = 0;
    this.drain();
  }

  /** Handles the queued frames within the turn's budget, the socket paused until all are; past maxPendingReplyBytes unsent, until the stream drains. */
  private drain(): void {
    while (this.offset < this.unparsed.length) {
      if (!this.open) return;
      const unread = this.socket.writableLength > (this.host.maxPendingReplyBytes ?? DEFAULT_MAX_PENDING_REPLY_BYTES);
      if (unread || !takeRequestTurn()) {
        if (!this.paused) this.socket.pause();
        this.paused = true;
        if (unread) this.socket.once('drain', () => this.drain());
        else setImmediate(() => this.drain());
        return;
      }
      const f = this.nextFrame();
      if (f !== null && !this.handle(f)) return;
    }
    this.unparsed = NOTHING;
    this.offset = 0;
    if (!this.open) return;
    if (this.hold && !this.hold.set(this.decoder.incompleteBytes)) return this.overBudget();
    if (this.paused) this.socket.resume();
    this.paused = false;
  }

  /** The next whole frame of the bytes read, or null when they end inside one (the decoder keeps it). */
  private nextFrame(): DecodeResult | null {
    while (this.offset < this.unparsed.length) {
      const n = Math.min(this.decoder.bytesToFrameEnd, this.unparsed.length - this.offset);
      const frames = this.decoder.push(this.unparsed.subarray(this.offset, this.offset + n));
      this.offset += n;
      if (frames.length > 0) return frames[0]!;
    }
    return null;
  }

  /** One decoded frame: its request answered; false when the connection failed on it. */
  private handle(f: DecodeResult): boolean {
    if (!f.ok) {
      this.fail(E.MALFORMED, f.error.type, f.error.message);
      return false;
    }
    const frame = f.value;
    const parsed = parseClientFrame(frame);
    if (!parsed.ok) {
      const refusal = parsed.error;
      if (refusal.fatal) {
        this.fail(refusal.code, frame.type, refusal.message);
        return false;
      }
      this.send(encodeError(refusal.code, frame.type, refusal.message));
      return true;
    }
    let reply: Reply;
    try {
      reply = this.host.request(this, parsed.value);
    } catch (e) {
      // A bug here must not take the helper or other clients down; this client is told and dropped.
      this.log.error({ err: (e as Error).stack }, 'v2 request failed');
      this.fail(E.MALFORMED, frame.type, `internal error: ${(e as Error).message}`);
      return false;
    }
    this.sendReply(reply);
    return true;
  }

  private overBudget(): void {
    this.fail(E.LIMIT, 0, 'the helper holds too many incomplete frames (all clients); send each frame whole and retry');
  }

  private onClose(): void {
    if (this.gone) return;
    this.gone = true;
    this.closing = true;
    const left = this.waiting ?? [];
    this.waiting = null;
    this.waitingBytes = 0;
    for (const r of left) this.drop(r);
    this.host.closed(this);
  }

  /** Writes a reply now: the stream has nothing queued before it if it carries fds. */
  private put(reply: Reply): void {
    if (!hasFds(reply)) {
      this.socket.write(reply.frame);
      return;
    }
    try {
      const send = this.host.sendWithFds;
      if (!send) throw cannotError('send file descriptors', 'this helper has no sendmsg wired to its v2 connections');
      const sent = send(this.socket, reply.frame, reply.fds);
      if (sent < reply.frame.length) this.socket.write(reply.frame.subarray(sent));
    } catch (e) {
      // The frame did not go out: the client would read the next one in its place, so it is dropped.
      this.log.warn({ err: (e as Error).message }, 'v2 reply with file descriptors not sent; disconnecting');
      this.destroy();
    } finally {
      this.release(reply);
    }
  }

  /** Calls flushWaiting() once everything queued on the stream so far has been written. */
  private afterQueued(): void {
    this.socket.write(NOTHING, () => this.flushWaiting());
  }

  private flushWaiting(): void {
    const q = this.waiting;
    if (q === null) return;
    while (q.length > 0 && !this.socket.destroyed) {
      const r = q[0]!;
      if (hasFds(r) && this.socket.writableLength > 0) return this.afterQueued();
      q.shift();
      this.waitingBytes -= r.frame.length;
      this.put(r);
    }
    this.waiting = null;
    this.waitingBytes = 0;
    for (const r of q) this.drop(r);
    if (this.endWhenSent && !this.socket.destroyed) this.socket.end();
  }

  /** A reply that will not be sent: its fds go back to their sender. Always false. */
  private drop(reply: Reply): false {
    this.release(reply);
    return false;
  }

  /** The reply's fds go back to their sender; a release that throws is a bug logged, not the helper's end. */
  private release(reply: Reply): void {
    try {
      reply.release?.();
    } catch (e) {
      this.log.error({ err: (e as Error).stack }, 'v2 reply fds release failed');
    }
  }
}

function hasFds(r: Reply): r is Reply & { fds: readonly number[] } {
  return r.fds !== undefined && r.fds.length > 0;
}
