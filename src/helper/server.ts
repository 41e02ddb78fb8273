/**
 * The listening socket and its connections: SO_PEERCRED at accept (close without it), protocol
 * chosen by the first 4 bytes, legacy sessions served in order. Each connection is independent:
 * whatever one client sends or does, only its own socket is closed.
 */
import fs from 'node:fs';
import net from 'node:net';
import type { PeerCredentials } from '../os/libc.js';
import { classifyPreamble, LEGACY_REPLY_SIZE, LegacyFramer, V2_MAGIC } from '../protocol/legacy.js';
import type { LegacyService } from './legacy-service.js';
import { peerOf } from '../os/peer.js';
import type { Logger } from './logger.js';
import { listen } from '../ratio/disposable.js';
import { cannotError } from '../ratio/errors.js';

/**
 * Takes over a connection that started with the v2 magic. `rest` holds the bytes already received
 * after the magic; the handler attaches its own 'data' listener (ours is removed before the call).
 */
export type V2Handler = (socket: net.Socket, peer: PeerCredentials, rest: Buffer) => void;

export type ListenTarget = { path: string } | { fd: number };

export interface HelperServerOptions {
  target: ListenTarget;
  legacy: LegacyService;
  v2Handler?: V2Handler;
  logger: Logger;
  /** Pause reading a legacy client while this many reply bytes wait to be sent to it. */
  maxPendingReplyBytes?: number;
}

export class HelperServer {
  private readonly server: net.Server;
  private readonly sockets = new Set<net.Socket>();
  /** Set when we bound a path ourselves: [path, inode] so we only ever remove our own file. */
  private bound: { path: string; ino: number } | undefined;

  constructor(private readonly o: HelperServerOptions) {
    this.server = net.createServer({ pauseOnConnect: false }, (s) => this.accept(s));
    this.server.on('error', (e) => this.o.logger.error({ err: e.message }, 'listening socket error'));
  }

  get connections(): number {
    return this.sockets.size;
  }

  /** Listens on the path (replacing a stale socket file, refusing a live one) or the inherited fd. */
  async listen(): Promise<void> {
    const t = this.o.target;
    if ('path' in t) await removeStaleSocket(t.path);
    await new Promise<void>((resolve, reject) => {
      const failed = listen(this.server, 'error', (e: Error) => {
        failed.dispose();
        reject(listenError(t, e));
      });
      const done = () => {
        failed.dispose();
        resolve();
      };
      if ('path' in t) this.server.listen({ path: t.path, backlog: 4096 }, done);
      else this.server.listen({ fd: t.fd, backlog: 4096 }, done);
    });
    if ('path' in t) this.bound = { path: t.path, ino: fs.statSync(t.path).ino };
  }

  /** Stops accepting, closes every connection, removes the socket file we bound (if still ours). */
  async close(): Promise<void> {
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    for (const s of this.sockets) s.destroy();
    await closed;
    if (this.bound) {
      try {
        if (fs.statSync(this.bound.path).ino === this.bound.ino) fs.unlinkSync(this.bound.path);
      } catch (e) {
        const err = e as NodeJS.ErrnoException;
        // libuv may have unlinked it already; EACCES after dropping to -u in a root-owned directory
        // is harmless: the next start replaces a socket nobody listens on.
        if (err.code !== 'ENOENT') this.o.logger.warn({ path: this.bound.path, err: err.code }, 'could not remove socket file');
      }
    }
  }

  private accept(socket: net.Socket): void {
    let peer: PeerCredentials;
    try {
      peer = peerOf(socket);
    } catch (e) {
      this.o.logger.warn({ err: (e as Error).message }, 'no peer credentials; closing connection');
      socket.destroy();
      return;
    }
    this.sockets.add(socket);
    const log = this.o.logger;
    log.debug({ peer: peer.pid, uid: peer.uid }, 'client connected');
    socket.on('close', () => {
      this.sockets.delete(socket);
      log.debug({ peer: peer.pid }, 'client disconnected');
    });
    // A vanished client (EPIPE/ECONNRESET) is ordinary; it must never reach the process.
    socket.on('error', (e) => log.debug({ peer: peer.pid, err: e.message }, 'client socket error'));

    let head: Buffer = Buffer.alloc(0);
    const preamble = listen(socket, 'data', (chunk: Buffer) => {
      head = head.length === 0 ? chunk : Buffer.concat([head, chunk]);
      const kind = classifyPreamble(head);
      if (kind === 'need-more') return;
      preamble.dispose();
      if (kind === 'v2' && this.o.v2Handler) {
        try {
          this.o.v2Handler(socket, peer, Buffer.from(head.subarray(V2_MAGIC.length)));
        } catch (e) {
          log.error({ peer: peer.pid, err: (e as Error).message }, 'v2 handler failed; closing connection');
          socket.destroy();
        }
        return;
      }
      this.serveLegacy(socket, peer, head);
    });
  }

  private serveLegacy(socket: net.Socket, peer: PeerCredentials, first: Buffer): void {
    const framer = new LegacyFramer();
    const maxPending = this.o.maxPendingReplyBytes ?? 64 * 1024;
    let closing = false;
    const legacy = this.o.legacy;
    const verdicts = legacy.verdictsFor(peer.pid);
    const onData = (chunk: Buffer) => {
      if (closing) return;
      const reqs = framer.push(chunk);
      if (reqs.length > 0) {
        // The replies to one chunk's requests, written at once (small sizes come from Node's pool).
        const out = Buffer.allocUnsafe(reqs.length * LEGACY_REPLY_SIZE);
        for (let i = 0; i < reqs.length; i++) {
          if (legacy.answer(peer.pid, reqs[i]!, verdicts, out, i * LEGACY_REPLY_SIZE)) continue;
          closing = true;
          data.dispose();
          if (i > 0) socket.write(out.subarray(0, i * LEGACY_REPLY_SIZE));
          socket.end(); // replies already queued still go out, in order
          setTimeout(() => socket.destroy(), 1000).unref();
          return;
        }
        socket.write(out);
      }
      // A client that pipelines without reading waits for itself, not the helper's memory.
      if (socket.writableLength > maxPending && !socket.isPaused()) {
        socket.pause();
        socket.once('drain', () => socket.resume());
      }
    };
    const data = listen(socket, 'data', onData);
    onData(first);
  }
}

function listenError(t: ListenTarget, e: Error): Error {
  const err = e as NodeJS.ErrnoException;
  if ('fd' in t) return cannotError(`listen on the socket passed by systemd (fd ${t.fd})`, err.message, 'check the .socket unit');
  if (err.code === 'EACCES') return cannotError(`create socket ${t.path}`, 'permission denied', 'run as root or choose another path with -k');
  if (err.code === 'ENOENT') return cannotError(`create socket ${t.path}`, 'its directory does not exist', 'create it or choose another path with -k');
  if (err.code === 'EADDRINUSE') return cannotError(`create socket ${t.path}`, 'address in use', 'another helper may be starting, or remove the file');
  return cannotError(`listen on ${t.path}`, err.message);
}

/**
 * A socket file nobody listens on (a crashed helper's) is removed; a live one, or a file that is not
 * a socket, is left alone and reported.
 */
export async function removeStaleSocket(socketPath: string): Promise<void> {
  let st: fs.Stats;
  try {
    st = fs.lstatSync(socketPath);
  } catch {
    return;
  }
  if (!st.isSocket()) throw new Error(`${socketPath} exists and is not a socket; remove it or choose another path with -k`);
  const live = await new Promise<boolean>((resolve) => {
    const c = net.connect({ path: socketPath });
    c.once('connect', () => {
      c.destroy();
      resolve(true);
    });
    // EAGAIN: the backlog of a live listener is full (a busy helper), not a dead socket.
    c.once('error', (e: NodeJS.ErrnoException) => resolve(e.code === 'EAGAIN'));
  });
  if (live) throw new Error(`another process is already listening on ${socketPath}; stop it or choose another path with -k`);
  fs.unlinkSync(socketPath);
}
