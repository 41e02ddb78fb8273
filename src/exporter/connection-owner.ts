/**
 * Whose a connection is, for its share of the slots: the local user at the other end (sock_diag; its subordinate uids are
 * that user), else the source address as the failed-password limits count it (docs/exporter.md "Limits").
 */
import type { Socket } from 'node:net';
import { SubordinateUids } from '../os/subordinate-uids.js';
import { TcpPeerUids } from '../os/tcp-peer-uid.js';
import { sourceOf } from './auth-failures.js';
import type { OwnerOf } from './connection-slots.js';

/** An owner by source address only: what the slots fall back to, and what a test without users uses. */
export const ownerBySource: OwnerOf = (socket) => `source ${sourceOf(socket.remoteAddress)}`;

export class ConnectionOwners {
  private readonly uids = new TcpPeerUids();
  private readonly subordinates = new SubordinateUids();
  private usable = true;

  readonly ownerOf: OwnerOf = (socket: Socket) => {
    const uid = this.usable ? this.localUid(socket) : null;
    return uid === null ? ownerBySource(socket) : `uid ${this.subordinates.ownerOf(uid)}`;
  };

  close(): void {
    this.uids.close();
  }

  private localUid(socket: Socket): number | null {
    try {
      return this.uids.uidOf(socket);
    } catch {
      // No netlink socket for this process: by source from now on.
      this.usable = false;
      return null;
    }
  }
}
