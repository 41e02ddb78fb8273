/**
 * The exporter's HTTP connection slots, so that connections nobody uses cannot lock out the scraper.
 *
 * Node's own limits do not hold here: `server.maxConnections` refuses new connections once the slots
 * are full, whoever holds them, and Node checks `headersTimeout` and `requestTimeout` only every
 * `connectionsCheckingInterval` (30 s), so an idle or slow-header connection lived 27 to 31 s: 32
 * of them, held by any local user, blocked every scrape. Here each connection has a timer of its
 * own, and a full table makes room:
 *
 *  - a connection with no request in progress (just opened, still sending its headers, or idle
 *    between keep-alive requests) is closed IDLE_MS after it opened or after its last response;
 *  - a request in progress (headers received, response not yet sent) is closed REQUEST_MS after its
 *    headers arrived, however slowly the client reads;
 *  - a request sent before the last one was answered (pipelining) closes the connection, that request
 *    and the ones after it unserved:
 *    one read can carry thousands of them, each a render written to a client that reads nothing,
 *    which kept every scrape waiting (Prometheus sends one request at a time);
 *  - when every slot is taken, a new connection makes room. Its owner is counted with the slots it
 *    holds, and goes: a connection refused its credentials (401, 429: markRefused) and idle; else
 *    the connection idle the longest of an owner holding more (the most first), of the new
 *    connection's own owner, or of an owner holding as many; else a refused one whose refusal is
 *    being written; else the oldest request in progress of the owner holding the most, when it
 *    holds more than the new connection's owner. Otherwise the new connection is closed at once.
 *
 * An owner (connection-owner.ts) is the local user at the other end, or the remote source address:
 * on loopback every local user has the same address, and one user reopening each connection it
 * loses would otherwise evict everyone else's, the scraper's between its connect and its request.
 * Prometheus holds one connection per target: it is evicted only when its own user holds the most.
 */
import type { Server } from 'node:http';
import type { Socket } from 'node:net';
import { ownerToEvict } from '../budget/uid-share.js';

interface SlotLimits {
  /** Connections at once. */
  max: number;
  /** A connection without a request in progress is closed after this long. */
  idleMs: number;
  /** A request in progress is closed this long after its headers arrived. */
  requestMs: number;
}

/** Who a connection belongs to, for the share of the slots (connection-owner.ts). */
export type OwnerOf = (socket: Socket) => string;

interface Slot {
  /** Requests received and not yet answered (0 or 1: a connection that pipelines is closed). */
  inProgress: number;
  timer: NodeJS.Timeout;
  /** A request of it was refused its credentials: while idle, evicted before any other connection. */
  refused: boolean;
  owner: string;
}

export interface SlotStats {
  open: number;
  /** Idle connections closed to make room for a new one. */
  evicted: number;
  /** New connections closed because every slot had a request in progress. */
  refused: number;
  /** Connections closed by the idle or request timer. */
  timedOut: number;
  /** Connections closed for sending a request before the last one was answered. */
  pipelined: number;
}

export class ConnectionSlots {
  /** Insertion order is the order in which connections last became idle: the first idle one is the oldest. */
  private readonly slots = new Map<Socket, Slot>();
  private readonly counts = { evicted: 0, refused: 0, timedOut: 0, pipelined: 0 };

  constructor(
    server: Server,
    private readonly limits: SlotLimits,
    private readonly ownerOf: OwnerOf,
  ) {
    server.on('connection', (socket: Socket) => this.admit(socket));
    // Before the request listener, which serves nothing on a socket closed here.
    server.prependListener('request', (req: { socket: Socket }, res: { once(e: 'close', f: () => void): unknown }) => {
      const slot = this.slots.get(req.socket);
      if (!slot) return;
      if (slot.inProgress > 0) {
        // Pipelined: one chunk read can hold thousands of requests, each a render, that the client
        // never needs to read (Prometheus waits for each response): none of them is served.
        this.counts.pipelined++;
        this.drop(req.socket);
        return;
      }
      slot.inProgress++;
      this.arm(req.socket, slot, limits.requestMs);
      res.once('close', () => {
        if (!this.slots.has(req.socket) || --slot.inProgress > 0) return;
        // Idle again: it moves to the young end of the table.
        this.slots.delete(req.socket);
        this.slots.set(req.socket, slot);
        this.arm(req.socket, slot, limits.idleMs);
      });
    });
  }

  /**
   * The request on `socket` was refused its credentials (a wrong password, or too many failed checks
   * from its source): while idle it is the first to make room, so a flood of wrong passwords over
   * keep-alive connections evicts itself before a scraper that just connected.
   */
  markRefused(socket: Socket): void {
    const slot = this.slots.get(socket);
    if (slot) slot.refused = true;
  }

  stats(): SlotStats {
    return { open: this.slots.size, ...this.counts };
  }

  private admit(socket: Socket): void {
    const owner = this.ownerOf(socket);
    if (this.slots.size >= this.limits.max) {
      const victim = this.victimFor(owner);
      if (victim === undefined) {
        this.counts.refused++;
        socket.destroy();
        return;
      }
      this.counts.evicted++;
      this.drop(victim);
    }
    const slot: Slot = { inProgress: 0, timer: setTimeout(() => {}, 0), refused: false, owner };
    this.slots.set(socket, slot);
    this.arm(socket, slot, this.limits.idleMs);
    socket.once('close', () => this.drop(socket));
  }

  /**
   * The connection that makes room for a new one of `owner`, or undefined (the rule in the header):
   * a refused idle one; the oldest idle one of an owner holding more, of `owner` itself, of an owner
   * holding as many; a refused one being answered; the oldest request of the owner holding the most.
   */
  private victimFor(owner: string): Socket | undefined {
    const all = [...this.slots];
    const held = new Map<string, number>([[owner, 1]]);
    for (const [, s] of all) held.set(s.owner, (held.get(s.owner) ?? 0) + 1);
    const mine = held.get(owner)!;
    // Most first; among equals, the one idle the longest (the table's order).
    const others = [...held.keys()].filter((o) => o !== owner).sort((a, b) => held.get(b)! - held.get(a)!);
    const more = others.filter((o) => held.get(o)! > mine);
    const asMany = others.filter((o) => held.get(o)! === mine);
    const oldest = (o: string, idle: boolean) => all.find(([, s]) => s.owner === o && (!idle || s.inProgress === 0));
    const oldestOf = (o: string | undefined, idle: boolean) => (o === undefined ? undefined : oldest(o, idle));
    const victim =
      all.find(([, s]) => s.refused && s.inProgress === 0) ??
      [...more, owner, ...asMany].map((o) => oldest(o, true)).find((e) => e !== undefined) ??
      // A refused connection's request in progress is only its refusal being written: it may go too.
      all.find(([, s]) => s.refused) ??
      oldestOf(
        ownerToEvict(others, (o) => held.get(o)!, owner, mine),
        false,
      );
    return victim?.[0];
  }

  private arm(socket: Socket, slot: Slot, ms: number): void {
    clearTimeout(slot.timer);
    slot.timer = setTimeout(() => {
      this.counts.timedOut++;
      this.drop(socket);
    }, ms);
    slot.timer.unref();
  }

  private drop(socket: Socket): void {
    const slot = this.slots.get(socket);
    if (slot) clearTimeout(slot.timer);
    this.slots.delete(socket);
    socket.destroy();
  }
}
