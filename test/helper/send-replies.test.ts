/**
 * A legacy connection's I/O on real Unix socket pairs. sendReplies: replies bypass Node's stream only
 * while it has nothing queued, so order holds when the socket's buffer fills and empties again, and a
 * peer that is gone closes the connection. readIntoBuffer: the accepted socket reads past the stream.
 */
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { readIntoBuffer, sendReplies } from '../../src/helper/legacy/legacy-session.js';

interface Pair {
  server: net.Socket;
  client: net.Socket;
}

const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanups.splice(0)) c();
});

/** A connected pair over a Unix socket in a fresh directory; the client starts paused (reads nothing). */
async function pair(): Promise<Pair> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-send-'));
  const file = path.join(dir, 's');
  // As the helper's server: a connection is not read until asked (so it does not see a hang-up first).
  const srv = net.createServer({ pauseOnConnect: true });
  await new Promise<void>((r) => srv.listen(file, r));
  const accepted = new Promise<net.Socket>((r) => srv.once('connection', r));
  const client = net.connect({ path: file });
  client.pause();
  const server = await accepted;
  server.on('error', () => {});
  client.on('error', () => {});
  cleanups.push(() => {
    client.destroy();
    server.destroy();
    srv.close();
    fs.rmSync(dir, { recursive: true, force: true });
  });
  return { server, client };
}

/** One reply per number: its 8 bytes little-endian, through a buffer reused as the server reuses its own. */
const scratch = Buffer.alloc(8 * 64);
function send(server: net.Socket, from: number, count: number): void {
  for (let i = 0; i < count; i++) scratch.writeBigUInt64LE(BigInt(from + i), i * 8);
  sendReplies(server, scratch, count * 8);
}

describe('sendReplies', () => {
  test('replies keep their order when the socket buffer fills, the stream queues and the peer reads again', async () => {
    const { server, client } = await pair();
    let next = 0;
    // Fill the kernel's buffers until the stream has to queue, then queue some more behind it.
    while (server.writableLength === 0) {
      send(server, next, 64);
      next += 64;
      if (next > 10_000_000) throw new Error('the socket never filled');
    }
    expect(server.writableLength).toBeGreaterThan(0);
    for (let k = 0; k < 10; k++, next += 64) send(server, next, 64);
    // The peer reads; every time it does, more replies are sent: while the stream still holds bytes
    // they must queue behind them, and once it is empty they may go straight out again.
    const total = next + 200 * 64;
    const got: bigint[] = [];
    let pending = Buffer.alloc(0);
    let queuedWhileReading = 0;
    const done = new Promise<void>((resolve) => {
      client.on('data', (d: Buffer) => {
        pending = Buffer.concat([pending, d]);
        const whole = pending.length - (pending.length % 8);
        for (let o = 0; o < whole; o += 8) got.push(pending.readBigUInt64LE(o));
        pending = pending.subarray(whole);
        if (next < total) {
          if (server.writableLength > 0) queuedWhileReading++;
          send(server, next, 64);
          next += 64;
        }
        if (got.length === total) resolve();
      });
    });
    client.resume();
    await done;
    expect(queuedWhileReading).toBeGreaterThan(0); // the case this test is for did happen
    for (let i = 0; i < total; i++) if (got[i] !== BigInt(i)) expect.fail(`reply ${i} is ${got[i]}`);
  });

  test('a peer that is gone closes the connection with the send error', async () => {
    const { server, client } = await pair();
    const closed = new Promise<Error | undefined>((r) => server.once('error', r));
    client.destroy();
    await new Promise((r) => setTimeout(r, 50));
    send(server, 0, 1);
    const err = (await closed) as NodeJS.ErrnoException;
    expect(err.code).toMatch(/^(EPIPE|ECONNRESET)$/);
    expect(server.destroyed).toBe(true);
  });
});

describe('readIntoBuffer', () => {
  /** Waits (up to 10 s, far above the few ms expected) until `check` holds; says what it waited for. */
  async function until(what: string, check: () => boolean): Promise<void> {
    const end = Date.now() + 10_000;
    while (!check()) {
      if (Date.now() > end) throw new Error(`waited 10 s for ${what}`);
      await new Promise((r) => setTimeout(r, 5));
    }
  }

  test('an accepted socket hands every read to the callback, none to the stream, when switched on this Node', async () => {
    const { server, client } = await pair();
    const got: Buffer[] = [];
    let streamed = 0;
    server.on('data', () => streamed++);
    // Valid during the call only (the server's one buffer): copied here, as the framer copies what it keeps.
    expect(readIntoBuffer(server, (c) => got.push(Buffer.from(c)))).toBe(true);
    server.resume();
    const sent = Buffer.from(Array.from({ length: 3000 }, (_, i) => i % 251));
    for (let o = 0; o < sent.length; o += 700) client.write(sent.subarray(o, o + 700));
    await until('3000 bytes through the callback', () => Buffer.concat(got).length >= sent.length);
    expect(Buffer.concat(got).equals(sent)).toBe(true);
    expect(streamed).toBe(0);
  });

  test('a switched socket reads nothing while paused and everything once resumed, and ends when the peer closes', async () => {
    const { server, client } = await pair();
    const got: Buffer[] = [];
    readIntoBuffer(server, (c) => got.push(Buffer.from(c)));
    server.resume();
    client.write('abc');
    await until('the first bytes', () => got.length > 0);
    server.pause();
    client.write('defgh');
    await new Promise((r) => setTimeout(r, 200));
    expect(Buffer.concat(got).toString()).toBe('abc');
    const closed = new Promise((r) => server.once('close', r));
    server.resume();
    await until('the bytes written while paused', () => Buffer.concat(got).length === 8);
    expect(Buffer.concat(got).toString()).toBe('abcdefgh');
    client.end();
    await closed;
  });
});
