/**
 * A reply that carries an fd (SCM_RIGHTS), over a real Unix socket: a small server speaks v2 frames
 * and answers LIST with a VM_LIST frame sent together with a memfd (standing in for the coming
 * STATS_FD reply: the point is the transport). Frames and fds must stay paired, and the connection
 * must go back to Node's own reading afterwards.
 */
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { V2Client } from '../../src/client/v2-client.js';
import { V2ConnectionError } from '../../src/client/v2-replies.js';
import { CLIENT_TYPES, encodeU32Frame, encodeUpdate, encodeVmList, T } from '../../src/protocol/v2/codec.js';
import { FrameDecoder, type Frame } from '../../src/protocol/v2/frame-decoder.js';
import { closeFd } from '../../src/os/libc/fds.js';
import { memfdCreate } from '../../src/os/libc/memfd-mmap.js';
import { sendFds, socketFd } from '../../src/os/libc/sockets.js';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const VM = {
  hostVmId: 7,
  pid: 42,
  uid: 0,
  nvpkg: 1,
  starttime: 9n,
  ended: false,
  discovered: true,
  wholeVmOnly: false,
  name: 'vm',
  uuid: null,
};

/** A helper stand-in: every request frame goes to `answer`, which replies through `send` (sendmsg, fds optional). */
async function server(answer: (f: Frame, send: (bytes: Buffer, fds?: number[]) => void, n: number) => void): Promise<string> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-fdreply-'));
  const sock = path.join(dir, 's');
  const srv = net.createServer((conn) => {
    const decoder = new FrameDecoder(CLIENT_TYPES);
    let magic = 4;
    let n = 0;
    const send = (bytes: Buffer, fds: number[] = []) => expect(sendFds(socketFd(conn)!, bytes, fds)).toBe(bytes.length);
    conn.on('data', (d: Buffer) => {
      const skip = Math.min(magic, d.length);
      magic -= skip;
      for (const f of decoder.push(d.subarray(skip))) if (f.ok) answer(f.value, send, n++);
    });
    conn.on('error', () => {});
  });
  await new Promise<void>((r) => srv.listen(sock, r));
  cleanups.push(() => (new Promise((r) => srv.close(r)), fs.rmSync(dir, { recursive: true, force: true })));
  return sock;
}

/** A memfd holding `text`; closed after the test (the copy sent is the client's). */
function memfdWith(text: string): number {
  const fd = memfdCreate('vmsr-test-stats');
  fs.writeSync(fd, text, 0);
  cleanups.push(() => closeFd(fd));
  return fd;
}

function readFd(fd: number): string {
  const b = Buffer.alloc(64);
  return b.subarray(0, fs.readSync(fd, b, 0, 64, 0)).toString();
}

const openFds = () => fs.readdirSync('/proc/self/fd').length;

async function connect(sock: string): Promise<V2Client> {
  const c = await V2Client.connect(sock);
  cleanups.push(() => c.close());
  return c;
}

describe('v2 client: a reply with an fd', () => {
  it('requestWithFd gets the reply and its working fd, after an UPDATE that came first, then reads as before', async () => {
    const stats = memfdWith('stats v0');
    const sock = await server((f, send, n) => {
      if (f.type !== T.LIST) return;
      if (n === 0) {
        send(encodeUpdate(99, 5n, [{ counter: 1n, energyUj: 2n }], false));
        send(encodeVmList([VM]), [stats]);
      } else send(encodeVmList([VM]));
    });
    const c = await connect(sock);
    const { reply, fd } = await c.requestWithFd(T.LIST, encodeU32Frame(T.LIST, 0));
    cleanups.push(() => closeFd(fd));
    expect(reply).toMatchObject({ type: T.VM_LIST, nextId: 0, entries: [expect.objectContaining({ hostVmId: 7, name: 'vm' })] });
    expect(fd).not.toBe(stats);
    expect(readFd(fd)).toBe('stats v0');
    // Back on Node's reading: an ordinary request is answered.
    expect((await c.list()).map((v) => v.hostVmId)).toEqual([7]);
  });

  it('a reply of the right type without its fd rejects, and the connection goes on', async () => {
    const sock = await server((f, send) => f.type === T.LIST && send(encodeVmList([VM])));
    const c = await connect(sock);
    await expect(c.requestWithFd(T.LIST, encodeU32Frame(T.LIST, 0))).rejects.toThrow(
      /answered LIST with VM_LIST but without the fd it should carry/,
    );
    expect((await c.list()).map((v) => v.hostVmId)).toEqual([7]);
  });

  it('an fd on a frame that carries none breaks the connection, and the fd is closed, not kept', async () => {
    const stray = memfdWith('stray');
    const sock = await server(
      (f, send) => f.type === T.LIST && send(encodeUpdate(99, 5n, [{ counter: 1n, energyUj: 2n }], false), [stray]),
    );
    const c = await connect(sock);
    const before = openFds();
    const err = await c.requestWithFd(T.LIST, encodeU32Frame(T.LIST, 0)).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(V2ConnectionError);
    expect((err as Error).message).toMatch(/helper sent an fd with UPDATE, which carries none/);
    await c.closed;
    // The duplicate fd read with recvmsg and the stray fd are both gone (the socket's own fd too).
    expect(openFds()).toBeLessThan(before);
  });

  it('more than one fd with the reply breaks the connection and keeps none of them', async () => {
    const a = memfdWith('a');
    const b = memfdWith('b');
    const sock = await server((f, send) => f.type === T.LIST && send(encodeVmList([VM]), [a, b]));
    const c = await connect(sock);
    const before = openFds();
    await expect(c.requestWithFd(T.LIST, encodeU32Frame(T.LIST, 0))).rejects.toThrow(/helper sent more than one fd with a frame/);
    await c.closed;
    expect(openFds()).toBeLessThan(before);
  });
});
