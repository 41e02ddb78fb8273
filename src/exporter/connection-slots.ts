/**
 * The exporter's HTTP connection slots (docs/exporter.md "HTTP"). Not Node's `server.maxConnections`, which
 * refuses new connections whoever holds the slots, nor its timeouts, checked only every `connectionsCheckingInterval`.
 */
import type { Server } from 'node:http';
import type { Socket } from 'node:net';
import { ownerToEvict } from '../budget/uid-share.js';

/** Connections at once; how long one may stay idle, and a request take from its headers. */
interface SlotLimits {
  max: number;
  idleMs: number;
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

export class ConnectionSlots {
  /** Insertion order is the order in which connections last became idle: the first idle one is the oldest. */
  private readonly slots = new Map<Socket, Slot>();

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
        // Pipelined: one read can hold thousands of requests, each a render the client need not read.
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

  /** The request on `socket` was refused its credentials: while idle it is the first to make room. */
  markRefused(socket: Socket): void {
    const slot = this.slots.get(socket);
    if (slot) slot.refused = true;
  }

  private admit(socket: Socket): void {
    const owner = this.ownerOf(socket);
    if (this.slots.size >= this.limits.max) {
      const victim = this.victimFor(owner);
      if (victim === undefined) {
        socket.destroy();
        return;
      }
      this.drop(victim);
    }
    const slot: Slot = { inProgress: 0, timer: setTimeout(() => {}, 0), refused: false, owner };
    this.slots.set(socket, slot);
    this.arm(socket, slot, this.limits.idleMs);
    socket.once('close', () => this.drop(socket));
  }

  /**
   * What makes room for a new connection of `owner`, or undefined: a refused idle one; the oldest idle one of an owner
   * holding more, of `owner`, of one holding as many; a refused one being answered; the hog's oldest request.
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
    const hog = ownerToEvict(others, (o) => held.get(o)!, owner, mine);
    const victim =
      all.find(([, s]) => s.refused && s.inProgress === 0) ??
      [...more, owner, ...asMany].map((o) => oldest(o, true)).find((e) => e !== undefined) ??
      // A refused connection's request in progress is only its refusal being written: it may go too.
      all.find(([, s]) => s.refused) ??
      (hog === undefined ? undefined : oldest(hog, false));
    return victim?.[0];
  }

  private arm(socket: Socket, slot: Slot, ms: number): void {
    clearTimeout(slot.timer);
    slot.timer = setTimeout(() => this.drop(socket), ms);
    slot.timer.unref();
  }

  private drop(socket: Socket): void {
    const slot = this.slots.get(socket);
    if (slot) clearTimeout(slot.timer);
    this.slots.delete(socket);
    socket.destroy();
  }
}
