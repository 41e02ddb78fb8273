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
 *  - when every slot is taken, a new connection evicts the connection that has been without a
 *    request in progress the longest, one that was refused its credentials (401, 429:
 *    markRefused) first; with every slot busy, a refused one whose refusal is being written. Only
 *    when all slots have a request in progress and none was refused is the new connection closed
 *    at once.
 *
 * Prometheus connects, sends its request at once and is answered in milliseconds: it is only ever
 * evicted if more than `max` newer connections arrive between its connect and its request.
 */
import type { Server } from 'node:http';
import type { Socket } from 'node:net';

interface SlotLimits {
  /** Connections at once. */
  max: number;
  /** A connection without a request in progress is closed after this long. */
  idleMs: number;
  /** A request in progress is closed this long after its headers arrived. */
  requestMs: number;
}

interface Slot {
  /** Requests received and not yet answered (pipelining can make it more than 1). */
  inProgress: number;
  timer: NodeJS.Timeout;
  /** A request of it was refused its credentials: while idle, evicted before any other connection. */
  refused: boolean;
}

export interface SlotStats {
  open: number;
  /** Idle connections closed to make room for a new one. */
  evicted: number;
  /** New connections closed because every slot had a request in progress. */
  refused: number;
  /** Connections closed by the idle or request timer. */
  timedOut: number;
}

export class ConnectionSlots {
  /** Insertion order is the order in which connections last became idle: the first idle one is the oldest. */
  private readonly slots = new Map<Socket, Slot>();
  private readonly counts = { evicted: 0, refused: 0, timedOut: 0 };

  constructor(
    server: Server,
    private readonly limits: SlotLimits,
  ) {
    server.on('connection', (socket: Socket) => this.admit(socket));
    server.on('request', (req: { socket: Socket }, res: { once(e: 'close', f: () => void): unknown }) => {
      const slot = this.slots.get(req.socket);
      if (!slot) return;
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
    if (this.slots.size >= this.limits.max) {
      const all = [...this.slots];
      const idle = all.filter(([, s]) => s.inProgress === 0);
      // A refused connection's request in progress is only its refusal being written: it may go too.
      const oldestIdle = idle.find(([, s]) => s.refused) ?? idle[0] ?? all.find(([, s]) => s.refused);
      if (oldestIdle === undefined) {
        this.counts.refused++;
        socket.destroy();
        return;
      }
      this.counts.evicted++;
      this.drop(oldestIdle[0]);
    }
    const slot: Slot = { inProgress: 0, timer: setTimeout(() => {}, 0), refused: false };
    this.slots.set(socket, slot);
    this.arm(socket, slot, this.limits.idleMs);
    socket.once('close', () => this.drop(socket));
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
