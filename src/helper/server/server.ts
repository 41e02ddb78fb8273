/** Connections: SO_PEERCRED at accept, the limits, the protocol by the first 4 bytes, then v2 or legacy; a client closes only its own. */
import type net from 'node:net';
import { socketFd, type PeerCredentials } from '../../os/libc/sockets.js';
import { epollSoleReady } from '../../os/libc/fds.js';
import { eventLoopFd } from '../../os/event-loop-fd.js';
import { BusyPoll, type BusyPollIo } from './busy-poll.js';
import { LEGACY_REPLY_SIZE, V2_MAGIC } from '../../protocol/legacy.js';
import type { LegacyService } from '../legacy/legacy-service.js';
import { connectingProcessStart, peerOf } from '../../os/peer.js';
import { LegacySession } from '../legacy/legacy-session.js';
import { MemorySettler } from './memory-settler.js';
import { DEFAULT_MAX_CONNECTIONS, pausedSocket, type Listener } from './listener.js';
import type { Logger } from '../../logging/logger.js';
import { cannot } from '../../common/errors.js';
import { LogLimiter } from '../../logging/log-limiter.js';
import { IncompleteFrames, IncompleteHold, type CutReason, type Unread } from './incomplete-frames.js';
import { ConnectionSeats, type Seat } from './connection-seats.js';
import type { ShareOwner } from '../../budget/uid-share.js';
import type { ConnectionKeep, FrozenConnection, HandedConnectionFd, Freezable, Frozen } from '../handover/frozen.js';
import { Preamble } from './preamble.js';

/** Takes over a connection that started with the v2 magic: `rest`, the bytes after it; `hold`, released by the server at close. */
export type V2Handler = (socket: net.Socket, peer: PeerCredentials, rest: Buffer, hold: IncompleteHold) => void;

/**
 * A v2 handler bound after the server serves (QEMU first: docs/daemon.md "Restarts"): `handler`, what the server calls, holds each
 * connection, paused, until `bind` hands the real handler every one held so far, in order.
 */
export function lateV2Handler(): { readonly handler: V2Handler; bind(real: V2Handler): void; readonly held: number } {
  let real: V2Handler | undefined;
  const waiting: Parameters<V2Handler>[] = [];
  return {
    handler: (socket, peer, rest, hold) => {
      if (real) return real(socket, peer, rest, hold);
      socket.pause();
      waiting.push([socket, peer, rest, hold]);
    },
    bind(h) {
      real = h;
      for (const args of waiting.splice(0)) {
        if (args[0].destroyed) continue;
        try {
          h(...args);
        } catch {
          args[0].destroy();
        }
      }
    },
    get held() {
      return waiting.length;
    },
  };
}

/** The replies of up to this many bytes are built in one buffer the server keeps (a 64 KiB read holds 5461 requests). */
const REPLY_SCRATCH_BYTES = 5462 * LEGACY_REPLY_SIZE;

interface Open {
  socket: net.Socket;
  peer: PeerCredentials;
  seat: Seat;
  hold: IncompleteHold;
  /** The connection as the incomplete-frame budget reads it, while its protocol is not known. */
  unread: Unread | undefined;
  /** No longer held outside this process (closed, or v2: ConnectionKeep). */
  unkeep(): void;
}

export interface HelperServerOptions {
  listener: Listener;
  legacy: LegacyService;
  v2Handler?: V2Handler;
  logger: Logger;
  maxConnections?: number;
  incomplete?: IncompleteFrames;
  /** Whether a peer is a preferred owner, bound only by --max-connections, not by a uid's share; default: every one. */
  preferredPeer?: (peer: PeerCredentials) => boolean;
  /** Whether a peer is a QEMU process of the socket's group: its first connection is outside every share; default: none. */
  qemuPeer?: (peer: PeerCredentials) => boolean;
  starttimeOf?: (pid: number) => number | null;
  /** The busy poll's longest window (µs; 0: never polls); default DEFAULT_BUSY_POLL_MAX_US. */
  busyPollMaxUs?: number;
  /** Holds each connection outside this process from its accept to its close, or until it is v2. */
  keep?: ConnectionKeep;
}

/** Busy polling on this process's event loop (os/event-loop-fd.ts), found at the first poll through the listening socket it watches. */
function loopPollIo(listenFd: number): BusyPollIo {
  let loop: number | null | undefined;
  return {
    ready: () => {
      if (loop === undefined) loop = eventLoopFd(listenFd);
      return loop === null ? undefined : epollSoleReady(loop);
    },
    nowUs: () => performance.now() * 1000,
    atTurnEnd: (run) => void setImmediate(run),
  };
}

export class HelperServer {
  private readonly sockets = new Set<net.Socket>();
  /** The connections a restart hands over (legacy, or protocol not known yet), each able to stop reading. */
  private readonly freezable = new Set<Freezable>();
  /** Where legacy replies are written before they are sent (one connection at a time: one thread). */
  private readonly replies = Buffer.allocUnsafe(REPLY_SCRATCH_BYTES);
  /** After legacy replies, the next request awaited polling (busy-poll.ts), on the loop found through the listening socket. */
  private readonly busyPoll: BusyPoll;
  readonly limiter: LogLimiter;
  readonly incomplete: IncompleteFrames;
  private readonly users: ConnectionSeats;
  private readonly memory = new MemorySettler(
    () => this.o.legacy.counters.ok + this.o.legacy.counters.refused + this.o.legacy.counters.failed,
    (before, after, closed) =>
      this.o.logger.info({ closed, rssBeforeMb: before, rssAfterMb: after }, 'memory given back after a burst of closed connections'),
  );

  constructor(private readonly o: HelperServerOptions) {
    this.limiter = new LogLimiter(o.logger);
    this.incomplete = o.incomplete ?? new IncompleteFrames();
    // Past capacity, a connection is accepted and closed at once, or makes room (the shares): not Node's maxConnections.
    this.users = new ConnectionSeats(o.maxConnections ?? DEFAULT_MAX_CONNECTIONS);
    this.busyPoll = new BusyPoll(loopPollIo(o.listener.fd), o.busyPollMaxUs);
  }

  get connections(): number {
    return this.sockets.size;
  }

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

  /** For a restart: new connections held unread, legacy and undecided ones stop reading (v2: the v2 service's); thaw(): called off. */
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

  /** Serves connections a restart handed over, each from its pending bytes (a request cut by the restart is answered once whole). */
  adopt(handed: readonly HandedConnectionFd[]): void {
    for (const h of handed) {
      const socket = pausedSocket(h.fd);
      this.accept(socket, h);
    }
  }

  async close(): Promise<void> {
    this.memory.stop();
    const closed = this.o.listener.close(this.o.logger);
    for (const s of this.sockets) s.destroy();
    await closed;
  }

  private accept(socket: net.Socket, handed?: Pick<HandedConnectionFd, 'kind' | 'pending'>): void {
    this.memory.accepted();
    const admitted = this.admit(socket);
    if (admitted === null) return;
    const c = this.open(socket, admitted, handed !== undefined);
    if (handed?.kind === 'legacy') {
      c.seat.decided();
      this.serveLegacy(c, handed.pending);
      return;
    }
    const preamble = new Preamble({
      socket,
      hold: c.hold,
      overBudget: () => this.overBudget(socket, c.peer),
      decided: (kind, head) => {
        c.seat.decided();
        this.freezable.delete(preamble);
        if (kind === 'v2' && this.o.v2Handler) this.serveV2(c, head);
        else this.serveLegacy(c, head);
      },
    });
    c.unread = preamble;
    this.freezable.add(preamble);
    socket.once('close', () => this.freezable.delete(preamble));
    if (handed !== undefined && handed.pending.length > 0) preamble.push(Buffer.from(handed.pending));
    if (preamble.decided || !this.freezable.has(preamble)) return;
    if (!this.incomplete.startReading(preamble)) {
      this.limiter.warn(
        'reading deferred',
        { peer: c.peer.pid, waiting: this.incomplete.waitingConnections, heldBytes: this.incomplete.heldBytes },
        'incomplete frames of other clients fill the budget: this connection is read once they complete or time out',
      );
    }
  }

  /** A connection let in: who it is, the share it counts in, and its pid when it is a QEMU's first (outside the shares); null: closed. */
  private admit(socket: net.Socket) {
    let peer: PeerCredentials;
    try {
      peer = peerOf(socket);
    } catch (e) {
      this.o.logger.warn({ err: (e as Error).message }, 'no peer credentials; closing connection');
      socket.destroy();
      return null;
    }
    const owner: ShareOwner = { uid: peer.uid, preferred: this.o.preferredPeer?.(peer) ?? true };
    // QEMU first (one connection per QEMU process): outside the shares, and it makes room when full.
    const qemuPid = this.users.qemuFirst(peer.pid) && this.o.qemuPeer?.(peer) ? peer.pid : undefined;
    const share = this.users.shares.room(owner);
    if (qemuPid === undefined && share.room === 0 && share.bound !== 'capacity') {
      const mine = this.users.shares.heldBy(peer.uid);
      this.limiter.warn(
        'refused connection',
        { uid: peer.uid, held: mine, limit: this.users.capacity, bound: share.bound },
        share.bound === 'uid'
          ? `connection refused: uid ${peer.uid} holds ${mine} connections, its share of --max-connections ${this.users.capacity} (a quarter for any user but root; a QEMU process's own connection is not counted)`
          : `connection refused: users other than root hold half of --max-connections ${this.users.capacity} (uid ${peer.uid} holds ${mine})`,
      );
      socket.destroy();
      return null;
    }
    const full = this.sockets.size >= this.users.capacity;
    if (full && !(qemuPid !== undefined ? this.users.makeRoomForQemu() : this.users.makeRoomFor(peer.uid))) {
      this.limiter.warn(
        'refused connection',
        { limit: this.users.capacity, uid: peer.uid },
        `connection refused: ${this.users.capacity} connections already open (--max-connections)`,
      );
      socket.destroy();
      return null;
    }
    try {
      if (this.o.starttimeOf) peer.starttime = connectingProcessStart(socket, peer.pid, this.o.starttimeOf);
    } catch (e) {
      this.o.logger.warn({ err: (e as Error).message }, 'no peer start time; closing connection');
      socket.destroy();
      return null;
    }
    return { peer, owner, qemuPid };
  }

  private open(socket: net.Socket, { peer, owner, qemuPid }: NonNullable<ReturnType<HelperServer['admit']>>, handedOver: boolean): Open {
    this.sockets.add(socket);
    // Held outside, a crash does not take it (docs/daemon.md "Crashes"); only root's and QEMU's: others' cost the keeper or PID 1 nothing.
    let kept = owner.preferred || qemuPid !== undefined ? (this.o.keep?.held(socketFd(socket)) ?? null) : null;
    const seat = this.users.seat(
      owner,
      () => {
        this.limiter.warn(
          'connection evicted',
          { peer: peer.pid, uid: peer.uid, limit: this.users.capacity },
          'closing a connection of the user holding the most connections: QEMU, or another user, needed a slot (--max-connections)',
        );
        socket.destroy();
      },
      qemuPid,
    );
    const log = this.o.logger;
    // A connection handed over by the previous image is the same client, not a new one.
    log.debug({ peer: peer.pid, uid: peer.uid }, handedOver ? 'client connection handed over' : 'client connected');
    const c: Open = {
      socket,
      peer,
      seat,
      unread: undefined,
      hold: new IncompleteHold(
        this.incomplete,
        () => socket.destroy(),
        peer.uid,
        (why) => this.logCut(why, peer),
      ),
      unkeep: () => {
        this.o.keep?.released(kept);
        kept = null;
      },
    };
    const onClose = () => {
      c.unkeep();
      seat.release();
      if (c.unread) this.incomplete.forget(c.unread);
      this.memory.closed();
      c.hold.set(0);
      this.sockets.delete(socket);
      log.debug({ peer: peer.pid }, 'client disconnected');
    };
    // A vanished client (EPIPE/ECONNRESET) is ordinary; it must never reach the process.
    socket.on('close', onClose);
    socket.on('error', (e: Error) => log.debug({ peer: peer.pid, err: e.message }, 'client socket error'));
    return c;
  }

  private serveV2(c: Open, head: Buffer): void {
    // A v2 client reconnects after a crash: its connection must close with the process.
    c.unkeep();
    try {
      // No copy: the v2 decoder copies what it keeps, and a refused chunk must not cost twice.
      this.o.v2Handler!(c.socket, c.peer, head.subarray(V2_MAGIC.length), c.hold);
    } catch (e) {
      this.o.logger.error({ peer: c.peer.pid, err: (e as Error).message }, 'v2 handler failed; closing connection');
      c.socket.destroy();
    }
  }

  /** A legacy connection, from its first bytes on (legacy/legacy-session.ts); handed over while it is served. */
  private serveLegacy(c: Open, first: Buffer): void {
    const session = new LegacySession({
      socket: c.socket,
      first,
      peer: c.peer,
      legacy: this.o.legacy,
      hold: c.hold,
      replies: this.replies,
      busyPoll: this.busyPoll,
      overBudget: (s) => this.overBudget(s, c.peer),
      ended: (s) => this.freezable.delete(s),
    });
    if (!session.start()) return;
    this.freezable.add(session);
    session.socket().once('close', () => this.freezable.delete(session));
  }

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
}
