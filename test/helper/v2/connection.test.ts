/**
 * V2Connection on real Unix sockets: frames kept until whole, the backlog limit, and replies with
 * file descriptors, which leave through the injected sender only once nothing is queued before them.
 * The sender here writes with a system call on the socket's fd, past the stream, as sendmsg will:
 * a sender called with bytes still queued would put its frame ahead of them.
 */
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { helperMessages } from '../../support/helper-messages.js';
import { pino } from 'pino';
import { E, T, encodeError, encodeFrame, encodeU32Frame, encodeRead } from '../../../src/protocol/v2/codec.js';
import { V2Connection, type ConnectionHost } from '../../../src/helper/v2/connection.js';
import type { Reply, SendWithFds } from '../../../src/helper/v2/reply.js';
import type { ClientRequest } from '../../../src/protocol/v2/messages.js';
import { peerOf } from '../../../src/os/peer.js';
import { socketFd } from '../../../src/os/libc/sockets.js';
import { waitFor } from '../../support/wait.js';
import { LogLimiter } from '../../../src/logging/log-limiter.js';

const log = pino({ level: 'silent' });
const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanups.splice(0).reverse()) c();
});

interface Setup {
  conn: V2Connection;
  client: net.Socket;
  /** Bytes the client read so far. */
  received(): Buffer;
  closedCalls: number;
}

/** A V2Connection serving the accepted end of a real Unix socket; the client end starts paused when asked. */
async function connect(host: Omit<ConnectionHost, 'closed' | 'limiter'>, o: { paused?: boolean } = {}): Promise<Setup> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-conn-'));
  const file = path.join(dir, 's');
  const srv = net.createServer({ pauseOnConnect: true });
  await new Promise<void>((r) => srv.listen(file, r));
  const accepted = new Promise<net.Socket>((r) => srv.once('connection', r));
  const client = net.connect({ path: file });
  client.on('error', () => {});
  let got = Buffer.alloc(0);
  client.on('data', (d: Buffer) => (got = Buffer.concat([got, d])));
  if (o.paused) client.pause();
  const socket = await accepted;
  const s: Setup = { conn: undefined as unknown as V2Connection, client, received: () => got, closedCalls: 0 };
  s.conn = new V2Connection(1, socket, peerOf(socket), { ...host, limiter: new LogLimiter(log), closed: () => s.closedCalls++ }, log);
  s.conn.start(Buffer.alloc(0));
  cleanups.push(() => {
    client.destroy();
    socket.destroy();
    srv.close();
    fs.rmSync(dir, { recursive: true, force: true });
  });
  return s;
}

const messages = helperMessages;

/** An fd of our own (/dev/null) and whether it is still open. */
function openFd(): { fd: number; isOpen(): boolean } {
  const fd = fs.openSync('/dev/null', 'r');
  return {
    fd,
    isOpen() {
      try {
        fs.fstatSync(fd);
        return true;
      } catch {
        return false;
      }
    },
  };
}

interface SenderCall {
  frame: Buffer;
  fds: readonly number[];
  /** Bytes the stream held when the sender was called. */
  queued: number;
}

/** Writes the first `take` bytes (all by default) with write(2) on the socket's fd, past the stream. */
function fdWriter(calls: SenderCall[], take?: number): SendWithFds {
  return (socket, frame, fds) => {
    calls.push({ frame, fds, queued: socket.writableLength });
    const n = take ?? frame.length;
    return fs.writeSync(socketFd(socket)!, frame, 0, n);
  };
}

/** A big frame (32 KiB of ERROR text) tagged with its number. */
const big = (n: number) => encodeError(E.LIMIT, T.READ, `${n}:`.padEnd(32 * 1024, 'x'));

describe('V2Connection', () => {
  it('answers a frame that arrives one byte at a time only once it is whole, and keeps the order', async () => {
    const seen: ClientRequest[] = [];
    const s = await connect({
      maxBacklogBytes: 1 << 20,
      request: (_c, req) => {
        seen.push(req);
        return { frame: encodeU32Frame(T.OK, req.type === T.READ ? req.vmId : 0) };
      },
    });
    const bytes = Buffer.concat([encodeRead(7, 0), encodeRead(8, 1)]);
    for (let i = 0; i < bytes.length; i++) {
      s.client.write(bytes.subarray(i, i + 1));
      await new Promise((r) => setTimeout(r, 2));
      // The first frame is 16 bytes: answered with its last byte, not before.
      if (i === 14) expect(seen).toHaveLength(0);
      if (i === 15) expect(seen).toHaveLength(1);
    }
    await waitFor(() => messages(s.received()).length === 2, 'two replies');
    expect(seen).toEqual([
      { type: T.READ, vmId: 7, vpkg: 0 },
      { type: T.READ, vmId: 8, vpkg: 1 },
    ]);
    expect(messages(s.received())).toEqual([
      { type: T.OK, vmId: 7 },
      { type: T.OK, vmId: 8 },
    ]);
  });

  it('stops reading the requests of a client that does not read its replies once they pass maxPendingReplyBytes, and answers the rest once it reads', async () => {
    for (const pending of [16 * 1024, 64 * 1024, 256 * 1024]) {
      let n = 0;
      const s = await connect(
        { maxBacklogBytes: 1 << 20, maxPendingReplyBytes: pending, request: () => ({ frame: big(n++) }) },
        { paused: true },
      );
      s.client.write(Buffer.concat(Array.from({ length: 200 }, () => encodeRead(1, 0))));
      // The kernel's buffer, then `pending` bytes on the stream, then nothing more is answered.
      // Waited for: the replies made to stop growing for 300 ms (20 s at most).
      let before = -1;
      for (const end = Date.now() + 20_000; (n === 0 || n !== before) && Date.now() < end;) {
        before = n;
        await new Promise((r) => setTimeout(r, 300));
      }
      expect(n, 'replies made while the client did not read').toBeLessThan(200);
      expect(s.conn.open).toBe(true);
      expect(s.closedCalls).toBe(0);
      s.client.resume();
      await waitFor(() => s.received().length === 200 * big(0).length, 'every reply once the client reads', undefined, 20_000);
      expect(messages(s.received()).map((m) => (m.type === T.ERROR ? Number(m.message.split(':')[0]) : -1))).toEqual([
        ...Array(200).keys(),
      ]);
    }
  });

  it('disconnects a client that does not read once its replies pass maxBacklogBytes, and reports the close once', async () => {
    let n = 0;
    const s = await connect(
      { maxBacklogBytes: 256 * 1024, maxPendingReplyBytes: 8 << 20, request: () => ({ frame: big(n++) }) },
      { paused: true },
    );
    const clientClosed = new Promise<void>((r) => s.client.once('close', () => r()));
    s.client.write(Buffer.concat(Array.from({ length: 200 }, () => encodeRead(1, 0))));
    await waitFor(() => s.closedCalls === 1, 'connection closed for its backlog');
    expect(s.conn.open).toBe(false);
    s.client.resume();
    await clientClosed;
    // Fewer replies than requests made it: the rest were never queued.
    expect(s.received().length).toBeLessThan(200 * big(0).length);
    expect(s.closedCalls).toBe(1);
  });

  // The burst is 64 frames of 32 KiB (2 MiB): far over the 16 KiB limit and over what the kernel's
  // socket buffer takes (a few hundred KiB), so most of it waits in the stream, unsent.
  const BURST = 64;
  const LIMIT = 16 * 1024;
  /** One sample's frames in one batch, as the fan-out sends them; what each send() returned. */
  const sample = (s: Setup, from: number): boolean[] => {
    const sent: boolean[] = [];
    s.conn.batch(() => {
      for (let i = 0; i < BURST; i++) sent.push(s.conn.send(big(from + i)));
    });
    return sent;
  };

  it("keeps a client that reads each sample whole when one sample's burst is over maxBacklogBytes", async () => {
    const s = await connect({ maxBacklogBytes: LIMIT, request: () => ({ frame: encodeU32Frame(T.OK, 0) }) });
    for (let k = 0; k < 3; k++) {
      expect(sample(s, k * BURST).every(Boolean)).toBe(true);
      await waitFor(() => s.received().length === (k + 1) * BURST * big(0).length, `sample ${k} read whole`, undefined, 20_000);
    }
    expect(s.conn.open).toBe(true);
    // A reply between samples fits: the last sample's burst is allowed on top of the limit.
    expect(s.conn.send(encodeU32Frame(T.OK, 9))).toBe(true);
    expect(s.closedCalls).toBe(0);
  });

  it('disconnects a client that left more than maxBacklogBytes of the last sample unread when the next sample comes', async () => {
    const s = await connect({ maxBacklogBytes: LIMIT, request: () => ({ frame: encodeU32Frame(T.OK, 0) }) }, { paused: true });
    expect(sample(s, 0).every(Boolean)).toBe(true); // one burst: allowed, though unread
    expect(s.conn.open).toBe(true);
    expect(sample(s, BURST)[0]).toBe(false); // the next sample finds the first one unread
    await waitFor(() => s.closedCalls === 1, 'connection closed for its backlog');
  });

  it("disconnects a client whose replies between samples pass maxBacklogBytes plus the last sample's burst", async () => {
    let n = 0;
    const s = await connect(
      { maxBacklogBytes: LIMIT, maxPendingReplyBytes: 8 << 20, request: () => ({ frame: big(n++) }) },
      { paused: true },
    );
    s.conn.batch(() => s.conn.send(big(1000))); // a sample of 32 KiB
    s.client.write(Buffer.concat(Array.from({ length: 200 }, () => encodeRead(1, 0))));
    await waitFor(() => s.closedCalls === 1, 'connection closed for its backlog');
    expect(s.conn.open).toBe(false);
  });

  it('sends a reply with fds through sendWithFds when nothing is queued, then releases its fds', async () => {
    const calls: SenderCall[] = [];
    const f = openFd();
    const released: number[] = [];
    const reply: Reply = { frame: encodeU32Frame(T.OK, 42), fds: [f.fd], release: () => (released.push(f.fd), fs.closeSync(f.fd)) };
    const s = await connect({ maxBacklogBytes: 1 << 20, sendWithFds: fdWriter(calls), request: () => reply });
    s.client.write(encodeRead(42, 0));
    await waitFor(() => messages(s.received()).length === 1, 'the reply');
    expect(messages(s.received())).toEqual([{ type: T.OK, vmId: 42 }]);
    expect(calls).toEqual([{ frame: encodeU32Frame(T.OK, 42), fds: [f.fd], queued: 0 }]);
    expect(released).toEqual([f.fd]);
    expect(f.isOpen()).toBe(false);
  });

  it('holds a reply with fds until queued bytes are written, and the frames after it behind it', async () => {
    const calls: SenderCall[] = [];
    const f = openFd();
    let n = 0;
    const s = await connect(
      {
        maxBacklogBytes: 8 << 20,
        maxPendingReplyBytes: 8 << 20,
        sendWithFds: fdWriter(calls),
        request: (_c, req) => {
          if (req.type !== T.READ) throw new Error('READ only');
          if (req.vmId === 99) return { frame: encodeU32Frame(T.OK, 99), fds: [f.fd], release: () => fs.closeSync(f.fd) };
          if (req.vmId === 100) return { frame: encodeU32Frame(T.OK, 100) };
          return { frame: big(n++) };
        },
      },
      { paused: true },
    );
    // 40 x 32 KiB fill the kernel's buffer and queue on the stream while the client does not read.
    s.client.write(Buffer.concat([...Array.from({ length: 40 }, () => encodeRead(1, 0)), encodeRead(99, 0), encodeRead(100, 0)]));
    await waitFor(() => n === 40, 'the big replies made');
    await new Promise((r) => setTimeout(r, 50));
    expect(calls).toHaveLength(0);
    s.conn.send(encodeU32Frame(T.OK, 101)); // sent by the service meanwhile: after the fd reply too
    s.client.resume();
    await waitFor(() => messages(s.received()).length === 43, 'every frame');
    const ms = messages(s.received());
    expect(ms.slice(0, 40).map((m) => (m.type === T.ERROR ? Number(m.message.split(':')[0]) : -1))).toEqual([...Array(40).keys()]);
    expect(ms.slice(40)).toEqual([
      { type: T.OK, vmId: 99 },
      { type: T.OK, vmId: 100 },
      { type: T.OK, vmId: 101 },
    ]);
    expect(calls).toHaveLength(1);
    expect(calls[0]!.queued).toBe(0);
    expect(f.isOpen()).toBe(false);
  });

  it('writes the rest of a frame the sender sent only part of through the stream', async () => {
    const calls: SenderCall[] = [];
    const fds: ReturnType<typeof openFd>[] = [];
    const s = await connect({
      maxBacklogBytes: 1 << 20,
      sendWithFds: fdWriter(calls, 3),
      request: () => {
        const f = openFd();
        fds.push(f);
        return { frame: encodeU32Frame(T.OK, 5), fds: [f.fd], release: () => fs.closeSync(f.fd) };
      },
    });
    s.client.write(Buffer.concat([encodeRead(5, 0), encodeRead(5, 0)]));
    await waitFor(() => messages(s.received()).length === 2, 'both replies');
    expect(messages(s.received())).toEqual([
      { type: T.OK, vmId: 5 },
      { type: T.OK, vmId: 5 },
    ]);
    expect(calls).toHaveLength(2);
    expect(fds.map((f) => f.isOpen())).toEqual([false, false]);
  });

  it('closes the connection and releases the fds when the sender fails or none is wired', async () => {
    for (const sendWithFds of [
      () => {
        throw new Error('sendmsg: EPIPE');
      },
      undefined,
    ]) {
      const f = openFd();
      const s = await connect({
        maxBacklogBytes: 1 << 20,
        ...(sendWithFds ? { sendWithFds } : {}),
        request: () => ({ frame: encodeU32Frame(T.OK, 1), fds: [f.fd], release: () => fs.closeSync(f.fd) }),
      });
      const clientClosed = new Promise<void>((r) => s.client.once('close', () => r()));
      s.client.write(encodeRead(1, 0));
      await clientClosed;
      expect(s.received().length).toBe(0);
      expect(f.isOpen()).toBe(false);
      await waitFor(() => s.closedCalls === 1, 'closed reported');
    }
  });

  it('releases the fds of a reply still waiting when the client goes, without sending them', async () => {
    const calls: SenderCall[] = [];
    const f = openFd();
    let n = 0;
    const s = await connect(
      {
        maxBacklogBytes: 8 << 20,
        maxPendingReplyBytes: 8 << 20,
        sendWithFds: fdWriter(calls),
        request: (_c, req) =>
          req.type === T.READ && req.vmId === 99
            ? { frame: encodeU32Frame(T.OK, 99), fds: [f.fd], release: () => fs.closeSync(f.fd) }
            : { frame: big(n++) },
      },
      { paused: true },
    );
    s.client.write(Buffer.concat([...Array.from({ length: 40 }, () => encodeRead(1, 0)), encodeRead(99, 0)]));
    await waitFor(() => n === 40, 'the big replies made');
    await new Promise((r) => setTimeout(r, 50));
    expect(f.isOpen()).toBe(true);
    s.client.destroy();
    await waitFor(() => s.closedCalls === 1, 'closed reported');
    await waitFor(() => !f.isOpen(), 'fds released');
    expect(calls).toHaveLength(0);
  });

  it('answers a frame of an unknown type with ERROR 1 and closes', async () => {
    const s = await connect({ maxBacklogBytes: 1 << 20, request: () => ({ frame: encodeU32Frame(T.OK, 0) }) });
    const clientClosed = new Promise<void>((r) => s.client.once('close', () => r()));
    s.client.write(encodeFrame(0x7e, 0, Buffer.alloc(4)));
    await clientClosed;
    const ms = messages(s.received());
    expect(ms).toHaveLength(1);
    expect(ms[0]).toMatchObject({ type: T.ERROR, code: E.MALFORMED });
  });
});
