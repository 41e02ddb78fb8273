/** Connections as a restart sees them (docs/daemon.md "Restarts"): frozen, handed over with the bytes read and not answered. */
import type net from 'node:net';
import type { HandedConnection, StateSnapshot } from '../../state/snapshot.js';
import type { OutsideKeep } from './outside-keep.js';

/** One connection the server can stop reading and hand over. */
export interface Freezable {
  readonly kind: HandedConnection['kind'];
  socket(): net.Socket;
  /** Stops reading; returns the bytes read and not answered (the start of a request, what the stream read ahead). */
  freeze(): Buffer;
  /** Reads again, from those bytes on (the restart was called off). */
  thaw(): void;
}

export type FrozenConnection = Omit<HandedConnection, 'ino'> & { socket: net.Socket };

/** What HelperServer.freeze() gives: the connections to hand over as they are now, and the way back. */
export interface Frozen {
  /** Every frozen connection still open, and each held by the listener (accepted, never read). */
  connections(): FrozenConnection[];
  /** Serves every connection again, and the listener's new ones (idempotent). */
  thaw(): void;
}

/** What a restart (restarter.ts) asks of the running daemon. */
export interface Restartable {
  /** Stops reading every connection that can be handed over, tells the v2 ones ERROR RESTARTING; `drained` once those are closed. */
  freeze(): Frozen & { readonly drained: boolean };
  /** The live state to hand over, taken now, between samples; throws when it cannot be. */
  snapshot(): StateSnapshot;
}

/** A connection handed over to this process: its fd (a connected stream socket) and its bytes. */
export type HandedConnectionFd = Omit<HandedConnection, 'ino'> & { fd: number };

/** How the server holds each connection outside its process, from its accept (held) until its close or it turns out v2 (released). */
export type ConnectionKeep = Pick<OutsideKeep, 'held' | 'released'>;

/** What a paused stream had read ahead into its buffer, taken out of it (no 'data' listener may be attached). */
export function drainReadable(socket: net.Socket): Buffer[] {
  const out: Buffer[] = [];
  for (let c: Buffer | null; (c = socket.read() as Buffer | null) !== null;) out.push(c);
  return out;
}
