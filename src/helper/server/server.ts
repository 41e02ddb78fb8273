/**
 * The connections of the listening socket (listener.ts opens it): SO_PEERCRED at accept (close without it), protocol
 * chosen by the first 4 bytes, legacy sessions served in order. Each connection is independent:
 * whatever one client sends or does, only its own socket is closed.
 */
import net from 'node:net';
import { type PeerCredentials, peerHungUp } from '../../os/libc.js';
import { classifyPreamble, LEGACY_REPLY_SIZE, LegacyFramer, V2_MAGIC } from '../../protocol/legacy.js';
import type { LegacyService } from '../legacy/legacy-service.js';
import { connectingProcessStart, peerOf, socketFd } from '../../os/peer.js';
import type { ConnectionKeep } from './connection-keep.js';
import { sendReplies } from '../legacy/send-replies.js';
import { takeOverLegacy } from '../legacy/legacy-reader.js';
import { MemorySettler } from '../lifecycle/memory-settler.js';
import type { Listener } from './listener.js';
import type { Logger } from '../../logging/logger.js';
import { listen } from '../../common/disposable.js';
import { cannot } from '../../common/errors.js';
import { LogLimiter } from '../../logging/log-limiter.js';
import { IncompleteFrames, type CutReason, type IncompleteHold } from './incomplete-frames.js';
import { ConnectionSeats } from './connection-seats.js';
import type { ShareOwner } from '../../common/uid-share.js';
import type { FrozenConnection, HandedConnectionFd, Freezable, Frozen } from './frozen.js';

/**
 * Takes over a connection that started with the v2 magic. `rest` holds the bytes already received
 * after the magic; the handler attaches its own 'data' listener (ours is removed before the call).
 * `hold` is the connection's account of incomplete-frame bytes (the server releases it at close).
 */
export type V2Handler = (socket: net.Socket, peer: PeerCredentials, rest: Buffer, hold: IncompleteHold) => void;

/** The replies of up to this many bytes are built in one buffer the server keeps (a 64 KiB read holds 5461 requests). */
const REPLY_SCRATCH_BYTES = 5462 * LEGACY_REPLY_SIZE;

/** Connections served at once by default (--max-connections); more are accepted and closed at once. */
export const DEFAULT_MAX_CONNECTIONS = 4096;

export interface HelperServerOptions {
  /** The listening socket, bound or adopted by whoever started the helper (listener.ts, openListener). */
  listener: Listener;
  legacy: LegacyService;
  v2Handler?: V2Handler;
  logger: Logger;
  /** Pause reading a legacy client while this many reply bytes wait to be sent to it. */
  maxPendingReplyBytes?: number;
  /** Connections at once (default DEFAULT_MAX_CONNECTIONS). */
  maxConnections?: number;
  /** Bound and deadline of incomplete frames (default DEFAULT_INCOMPLETE_LIMITS). */
  incomplete?: IncompleteFrames;
  /** Rate limit of what clients can make the server log (default: one on `logger`). */
  limiter?: LogLimiter;
  /**
   * Whether a peer is a preferred owner (root, or the socket's group: every QEMU), bound only by
   * --max-connections; any other uid holds at most its share of them (common/uid-share.ts). Default:
   * every peer is preferred.
   */
  preferredPeer?: (peer: PeerCredentials) => boolean;
  /** The start time of a process (null when gone), read for each peer at accept (PeerCredentials.starttime). */
  starttimeOf?: (pid: number) => number | null;
  /** Holds each connection outside this process from its accept to its close, or until it is v2 (lifecycle/outside-keep.ts). */
  keep?: ConnectionKeep;
}

export class HelperServer {
  /** The socket serving each open connection (a legacy one's is the socket that took it over). */
  private readonly sockets = new Set<net.Socket>();
  /** The connections a restart hands over (legacy, or protocol not known yet), each able to stop reading. */
  private readonly freezable = new Set<Freezable>();
  /**
   * Past it, a connection is accepted and closed at once (the client sees it closed). Counted here,
   * not by Node's server.maxConnections, which stops counting a legacy connection once taken over.
   */
  private readonly maxConnections: number;
  /** Where legacy replies are written before they are sent (one connection at a time: the loop is single-threaded). */
  private readonly replies = Buffer.allocUnsafe(REPLY_SCRATCH_BYTES);
  readonly limiter: LogLimiter;
  readonly incomplete: IncompleteFrames;
  /** The connection slots per user: each uid's share, and the eviction that keeps one user from taking them all. */
  private readonly users: ConnectionSeats;
  /** Gives memory back to the kernel after many connections closed. */
  private readonly memory = new MemorySettler((before, after, closed) =>
    this.o.logger.info({ closed, rssBeforeMb: before, rssAfterMb: after }, 'memory given back after a burst of closed connections'),
  );

  constructor(private readonly o: HelperServerOptions) {
    this.limiter = o.limiter ?? new LogLimiter(o.logger);
    this.incomplete = o.incomplete ?? new IncompleteFrames();
    this.maxConnections = o.maxConnections ?? DEFAULT_MAX_CONNECTIONS;
    this.users = new ConnectionSeats(this.maxConnections);
  }

  get connections(): number {
    return this.sockets.size;
  }

  /** Serves the listener's connections, those that waited for it first. */
  serve(): void {
    this.o.listener.serve(
      (s) => this.accept(s),
      // EMFILE/ENFILE on accept: libuv closes the pending connection and goes on accepting.
      (e: NodeJS.ErrnoException) =>
        e.code === 'EMFILE' || e.code === 'ENFILE'
          ? this.limiter.error(
              'EMFILE',
              { err: e.message, connections: this.sockets.size },
              cannot('accept a connection', 'out of file descriptors', 'it was closed, the helper goes on'),
            )
          : this.limiter.error('listening socket error', { err: e.message }, 'listening socket error'),
    );
  }

  /**
   * For a restart: connections accepted from now on are held unread, and every legacy connection and
   * every one whose protocol is not known yet stops reading. Returns each with the bytes it read and
   * did not answer (frozen.ts); `thaw()` serves them all again, as if nothing happened (the restart was
   * called off). v2 connections are the v2 service's (it tells them the helper restarts).
   */
  freeze(): Frozen {
    this.o.listener.hold();
    const frozen = [...this.freezable].map((f) => ({ f, pending: f.freeze() }));
    const connections = (): FrozenConnection[] => [
      ...frozen.filter(({ f }) => !f.socket().destroyed).map(({ f, pending }) => ({ socket: f.socket(), kind: f.kind, pending })),
      ...this.o.listener.heldConnections
        .filter((s) => !s.destroyed)
        .map((socket) => ({ socket, kind: 'undecided' as const, pending: Buffer.alloc(0) })),
    ];
    let thawed = false;
    return {
      connections,
      thaw: () => {
        if (thawed) return;
        thawed = true;
        for (const { f } of frozen) if (!f.socket().destroyed) f.thaw();
        this.serve();
      },
    };
  }

  /**
   * Serves connections a restart handed over (frozen.ts: checked fds, with what the previous process
   * read of them): a legacy one goes on from its pending bytes (a request cut by the restart is
   * answered once its rest arrives), one whose protocol was not known yet is read from its first byte.
   */
  adopt(handed: readonly HandedConnectionFd[]): void {
    for (const h of handed) {
      // pauseOnCreate: read only once served (the incomplete-frame budget, or the legacy take-over).
      const socket = new net.Socket({ fd: h.fd, readable: true, writable: true, pauseOnCreate: true } as net.SocketConstructorOpts);
      this.accept(socket, h);
    }
  }

  /** Stops accepting, closes every connection, removes the socket file we bound (if still ours). */
  async close(): Promise<void> {
    this.memory.stop();
    const closed = this.o.listener.close(this.o.logger);
    for (const s of this.sockets) s.destroy();
    await closed;
  }

  private accept(socket: net.Socket, handed?: Pick<HandedConnectionFd, 'kind' | 'pending'>): void {
    let peer: PeerCredentials;
    try {
      peer = peerOf(socket);
    } catch (e) {
      this.o.logger.warn({ err: (e as Error).message }, 'no peer credentials; closing connection');
      socket.destroy();
      return;
    }
    const owner: ShareOwner = { uid: peer.uid, preferred: this.o.preferredPeer?.(peer) ?? true };
    const share = this.users.room(owner);
    if (share.room === 0 && share.bound !== 'capacity') {
      const mine = this.users.heldBy(peer.uid);
      this.limiter.warn(
        'refused connection',
        { uid: peer.uid, held: mine, limit: this.maxConnections, bound: share.bound },
        share.bound === 'uid'
          ? `connection refused: uid ${peer.uid} holds ${mine} connections, its share of --max-connections ${this.maxConnections} (a quarter for a user that is neither root nor in --socket-group)`
          : `connection refused: users that are neither root nor in --socket-group hold half of --max-connections ${this.maxConnections} (uid ${peer.uid} holds ${mine})`,
      );
      socket.destroy();
      return;
    }
    if (this.sockets.size >= this.maxConnections && !this.users.makeRoomFor(peer.uid)) {
      this.limiter.warn(
        'refused connection',
        { limit: this.maxConnections, uid: peer.uid },
        `connection refused: ${this.maxConnections} connections already open (--max-connections)`,
      );
      socket.destroy();
      return;
    }
    try {
      if (this.o.starttimeOf) peer.starttime = connectingProcessStart(socket, peer.pid, this.o.starttimeOf);
    } catch (e) {
      this.o.logger.warn({ err: (e as Error).message }, 'no peer start time; closing connection');
      socket.destroy();
      return;
    }
    this.sockets.add(socket);
    // Outside this process from now on: a crash does not take the connection along (docs/daemon.md
    // "Crashes"). Only a preferred peer's (root, the socket's group: every QEMU): another user's
    // connections cost the keeper or PID 1 nothing, however many it opens.
    let kept = owner.preferred ? (this.o.keep?.held(socketFd(socket)) ?? null) : null;
    const unkeep = () => (this.o.keep?.released(kept), (kept = null));
    const seat = this.users.seat(owner, () => {
      this.limiter.warn(
        'connection evicted',
        { peer: peer.pid, uid: peer.uid, limit: this.maxConnections },
        'closing a connection not read yet of the user holding the most connections: another user needed a slot (--max-connections)',
      );
      socket.destroy();
    });
    const log = this.o.logger;
    // A connection handed over by the previous image is the same client, not a new one.
    log.debug({ peer: peer.pid, uid: peer.uid }, handed ? 'client connection handed over' : 'client connected');
    /** The socket serving this connection: the accepted one, or the one that took a legacy connection over. */
    let serving = socket;
    const hold = this.incomplete.hold(
      () => serving.destroy(),
      peer.uid,
      (why) => this.logCut(why, peer),
    );
    /** Reading stopped for a restart: the incomplete-frame budget must not start it (thaw does). */
    let frozen = false;
    let wasReading = false;
    const unread = {
      resume: () => (frozen ? (wasReading = true) : socket.resume()),
      destroy: () => socket.destroy(),
      get destroyed() {
        return socket.destroyed;
      },
      hungUp: () => {
        const fd = socketFd(socket);
        return fd !== undefined && peerHungUp(fd);
      },
    };
    const onClose = () => {
      unkeep();
      seat.release();
      this.incomplete.forget(unread, peer.uid);
      this.memory.closed();
      hold.release();
      this.sockets.delete(serving);
      log.debug({ peer: peer.pid }, 'client disconnected');
    };
    // A vanished client (EPIPE/ECONNRESET) is ordinary; it must never reach the process.
    const onError = (e: Error) => log.debug({ peer: peer.pid, err: e.message }, 'client socket error');
    socket.on('close', onClose);
    socket.on('error', onError);
    /** The connection is served by `next` from now on; the accepted socket is closed (not the connection). */
    const handOver = (next: net.Socket) => {
      socket.off('close', onClose);
      this.sockets.delete(socket);
      this.sockets.add(next);
      serving = next;
      next.on('close', onClose);
      next.on('error', onError);
      socket.destroy();
    };

    if (handed?.kind === 'legacy') {
      seat.decided();
      this.serveLegacy(socket, peer, handed.pending, hold, handOver);
      return;
    }
    let head: Buffer = Buffer.alloc(0);
    const onHead = (chunk: Buffer) => {
      head = head.length === 0 ? chunk : Buffer.concat([head, chunk]);
      const kind = classifyPreamble(head);
      if (kind === 'need-more') {
        if (!hold.set(head.length)) this.overBudget(socket, peer);
        return;
      }
      hold.set(0);
      preamble.dispose();
      seat.decided();
      this.freezable.delete(undecided);
      if (kind === 'v2' && this.o.v2Handler) {
        // A v2 client reconnects after a crash: its connection must close with the process.
        unkeep();
        try {
          // No copy: the v2 decoder copies what it keeps, and a refused chunk must not cost twice.
          this.o.v2Handler(socket, peer, head.subarray(V2_MAGIC.length), hold);
        } catch (e) {
          log.error({ peer: peer.pid, err: (e as Error).message }, 'v2 handler failed; closing connection');
          socket.destroy();
        }
        return;
      }
      this.serveLegacy(socket, peer, head, hold, handOver);
    };
    let preamble = listen(socket, 'data', onHead);
    /** Read ahead by the stream after reading stopped for a restart (given back by thaw). */
    let readAhead: Buffer[] = [];
    const undecided: Freezable = {
      kind: 'undecided',
      socket: () => socket,
      freeze: () => {
        frozen = true;
        preamble.dispose();
        wasReading = socket.readableFlowing === true;
        socket.pause();
        readAhead = drainReadable(socket);
        return Buffer.concat([head, ...readAhead]);
      },
      thaw: () => {
        frozen = false;
        preamble = listen(socket, 'data', onHead);
        for (const c of readAhead.splice(0)) if (this.freezable.has(undecided)) onHead(c);
        if (wasReading && this.freezable.has(undecided)) socket.resume();
      },
    };
    this.freezable.add(undecided);
    socket.once('close', () => this.freezable.delete(undecided));
    if (handed !== undefined && handed.pending.length > 0) onHead(Buffer.from(handed.pending));
    if (!this.freezable.has(undecided)) return;
    if (!this.incomplete.startReading(unread, peer.uid)) {
      this.limiter.warn(
        'reading deferred',
        { peer: peer.pid, waiting: this.incomplete.waitingConnections, heldBytes: this.incomplete.heldBytes },
        'incomplete frames of other clients fill the budget: this connection is read once they complete or time out',
      );
    }
  }

  /** A connection's incomplete frame was cut (its deadline, or evicted for a user holding less): logged, rate-limited. */
  private logCut(why: CutReason, peer: PeerCredentials): void {
    if (why === 'deadline')
      this.limiter.info(
        'incomplete frame timeout',
        { peer: peer.pid, deadlineMs: this.incomplete.limits.deadlineMs },
        'closing a connection whose request stayed incomplete past the deadline',
      );
    else
      this.limiter.warn(
        'incomplete frame evicted',
        { peer: peer.pid, uid: peer.uid, heldByUid: this.incomplete.heldBy(peer.uid), limit: this.incomplete.limits.maxBytes },
        'closing a connection of the user holding the most incomplete frames: another user needed room in the budget',
      );
  }

  private overBudget(socket: net.Socket, peer: PeerCredentials): void {
    this.limiter.warn(
      'incomplete frames over budget',
      { peer: peer.pid, limit: this.incomplete.limits.maxBytes },
      'closing a connection: incomplete requests of all clients hold more than the limit',
    );
    socket.destroy();
  }

  private serveLegacy(
    accepted: net.Socket,
    peer: PeerCredentials,
    first: Buffer,
    hold: IncompleteHold,
    handOver: (next: net.Socket) => void,
  ): void {
    const framer = new LegacyFramer();
    let socket = accepted;
    let stopReading = () => {};
    const maxPending = this.o.maxPendingReplyBytes ?? 64 * 1024;
    let closing = false;
    /** Reading stopped for a restart: a drained backlog must not start it again (thaw does). */
    let frozen = false;
    const legacy = this.o.legacy;
    const verdicts = legacy.verdictsFor(peer.pid);
    const onData = (chunk: Buffer) => {
      if (closing) return;
      const reqs = framer.push(chunk);
      if (reqs.length > 0) {
        // The replies to one chunk's requests, sent at once from the shared scratch buffer.
        const size = reqs.length * LEGACY_REPLY_SIZE;
        const out = size <= this.replies.length ? this.replies : Buffer.allocUnsafe(size);
        for (let i = 0; i < reqs.length; i++) {
          if (legacy.answer(peer.pid, reqs[i]!, verdicts, out, i * LEGACY_REPLY_SIZE)) continue;
          closing = true;
          this.freezable.delete(session);
          stopReading();
          if (i > 0) sendReplies(socket, out, i * LEGACY_REPLY_SIZE);
          socket.end(); // replies already queued still go out, in order
          setTimeout(() => socket.destroy(), 1000).unref();
          return;
        }
        sendReplies(socket, out, size);
      }
      if (!hold.set(framer.buffered)) return this.overBudget(socket, peer);
      // A client that pipelines without reading waits for itself, not the helper's memory.
      if (socket.writableLength > maxPending && !socket.isPaused()) {
        socket.pause();
        socket.once('drain', () => frozen || socket.resume());
      }
    };
    const session: Freezable = {
      kind: 'legacy',
      socket: () => socket,
      freeze: () => Buffer.from(framer.incomplete),
      thaw: () => {},
    };
    const legacyDone = () => this.freezable.delete(session);
    onData(first);
    if (closing) return;
    // Bytes the accepted socket read past `first` and holds (none, usually) come before the rest.
    accepted.pause();
    for (let rest: Buffer | null; !closing && (rest = accepted.read() as Buffer | null) !== null;) onData(rest);
    if (closing) return;
    // Taken over only with nothing queued to write: destroying the accepted socket drops its queue.
    const fast = accepted.writableLength === 0 ? takeOverLegacy(accepted, onData) : null;
    if (fast !== null) {
      socket = fast;
      handOver(fast);
      stopReading = () => fast.pause();
      session.freeze = () => {
        frozen = true;
        fast.pause();
        return Buffer.from(framer.incomplete);
      };
      session.thaw = () => {
        frozen = false;
        if (fast.writableLength <= maxPending) fast.resume();
        else fast.once('drain', () => frozen || fast.resume());
      };
    } else {
      // Out of fds for a duplicate, or replies queued: served through the stream, as it is.
      let data = listen(accepted, 'data', onData);
      accepted.resume();
      stopReading = () => data.dispose();
      let readAhead: Buffer[] = [];
      session.freeze = () => {
        frozen = true;
        data.dispose();
        accepted.pause();
        readAhead = drainReadable(accepted);
        return Buffer.concat([framer.incomplete, ...readAhead]);
      };
      session.thaw = () => {
        frozen = false;
        data = listen(accepted, 'data', onData);
        for (const c of readAhead.splice(0)) if (!closing) onData(c);
        if (!closing) accepted.resume();
      };
    }
    this.freezable.add(session);
    socket.once('close', legacyDone);
  }
}

/** What a paused stream had read ahead into its buffer, taken out of it (no 'data' listener may be attached). */
function drainReadable(socket: net.Socket): Buffer[] {
  const out: Buffer[] = [];
  for (let c: Buffer | null; (c = socket.read() as Buffer | null) !== null;) out.push(c);
  return out;
}
