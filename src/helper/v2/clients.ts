/** The open v2 connections: who each is for the visibility rule, and whether it HOST_SUBSCRIBEd. */
import type { Viewer } from './vm-registry.js';

/** What the service sends to a client; V2Connection is one. */
export interface Subscriber {
  readonly id: number;
  readonly peer: { readonly uid: number };
  /** VMs it watches (SUBSCRIBE or OBSERVE) that have not ended. */
  readonly subscriptions: Set<number>;
  /** Of those, the ones it asked to get with their other RAPL domains (WATCH_DOMAINS). Changed through watch() and unwatch() only. */
  readonly domainSubscriptions: Set<number>;
  send(frame: Buffer): boolean;
  /** Runs `fn`, whose send()s leave in one write. */
  batch(fn: () => void): void;
}

interface Client<C extends Subscriber> {
  readonly conn: C;
  readonly viewer: Viewer;
  /** HOST_SUBSCRIBEd: whether it asked for per-package unattributed energy; undefined when it did not. */
  hostPerPackage: boolean | undefined;
  /** Whether its HOST_SUBSCRIBE asked for the other RAPL domains (false when it did not subscribe). */
  hostDomains: boolean;
}

/** `conn` watches VM `vmId` from now on, with its other RAPL domains or not (a second SUBSCRIBE or OBSERVE replaces the choice). */
export function watch(conn: Subscriber, vmId: number, domains: boolean): void {
  conn.subscriptions.add(vmId);
  if (domains) conn.domainSubscriptions.add(vmId);
  else conn.domainSubscriptions.delete(vmId);
}

/** `conn` stops watching VM `vmId`; false when it was not watching it. */
export function unwatch(conn: Subscriber, vmId: number): boolean {
  conn.domainSubscriptions.delete(vmId);
  return conn.subscriptions.delete(vmId);
}

export class Clients<C extends Subscriber> {
  private readonly byConn = new Map<C, Client<C>>();
  private hostSubscribers = 0;

  /** `holdHost(true)` when the first host subscriber comes, `holdHost(false)` when the last goes. */
  constructor(
    private readonly holdHost: (on: boolean) => void,
    private nextConnId = 1,
  ) {}

  /** The id of the next connection (connection ids are never reused). */
  newId(): number {
    return this.nextConnId++;
  }

  add(conn: C, viewer: Viewer): void {
    this.byConn.set(conn, { conn, viewer, hostPerPackage: undefined, hostDomains: false });
  }

  /** The connection is gone; false when it was not here. */
  remove(conn: C): boolean {
    const c = this.byConn.get(conn);
    if (!c) return false;
    this.byConn.delete(conn);
    if (c.hostPerPackage !== undefined && --this.hostSubscribers === 0) this.holdHost(false);
    return true;
  }

  /** Who `conn` is for the visibility rule; a connection not (or no longer) here sees only its own uid's VMs. */
  viewerOf(conn: C): Viewer {
    return this.byConn.get(conn)?.viewer ?? { connId: conn.id, uid: conn.peer.uid, seesAll: false };
  }

  /** HOST_SUBSCRIBE: a second one on the connection replaces the first's choice of layout. */
  subscribeHost(conn: C, perPackage: boolean, domains = false): void {
    const c = this.byConn.get(conn);
    if (!c) return;
    if (c.hostPerPackage === undefined && this.hostSubscribers++ === 0) this.holdHost(true);
    c.hostPerPackage = perPackage;
    c.hostDomains = domains;
  }

  get size(): number {
    return this.byConn.size;
  }

  [Symbol.iterator](): IterableIterator<Client<C>> {
    return this.byConn.values();
  }

  connections(): C[] {
    return [...this.byConn.keys()];
  }
}
