/**
 * The daemon's sender of replies with fds (assemble.ts) on a real Unix socket: a V2Connection
 * answers a request with a frame and an fd, and a python3 client receives both with recvmsg(2) and
 * writes through the fd it got; the daemon's copy is released once sent.
 */
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { pino } from 'pino';
import { encodeU32Frame, encodeRead, T } from '../../../src/protocol/v2/codec.js';
import { V2Connection } from '../../../src/helper/v2/connection.js';
import { sendWithFdsOnSocket } from '../../../src/helper/assemble.js';
import { peerOf } from '../../../src/os/peer.js';
import { LogLimiter } from '../../../src/logging/log-limiter.js';
import { missing } from '../../support/env.js';

const log = pino({ level: 'silent' });
const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanups.splice(0).reverse()) c();
});

// Connects, sends the request, takes one reply with SCM_RIGHTS, writes through the fd, prints the reply's hex and the fd count.
const CLIENT = `
import array, socket, sys, os
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(bytes.fromhex(sys.argv[2]))
data, anc, flags, _ = s.recvmsg(4096, socket.CMSG_SPACE(4 * 4))
fds = array.array('i')
for level, kind, payload in anc:
    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS: fds.frombytes(payload[: len(payload) - len(payload) % 4])
for fd in fds: os.write(fd, b'written through the fd')
print(data.hex(), len(fds))`;

describe('sendWithFdsOnSocket', () => {
  it('delivers a reply frame and its fd in one message, which the client can use, and the daemon releases its copy', async (ctx) => {
    const why = missing({ command: 'python3' });
    if (why) return ctx.skip(why);
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-fdsend-'));
    cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
    const target = path.join(dir, 'target');
    const file = path.join(dir, 's');
    let released = 0;
    const srv = net.createServer({ pauseOnConnect: true }, (socket) => {
      const fd = fs.openSync(target, 'w');
      const conn = new V2Connection(
        1,
        socket,
        peerOf(socket),
        {
          maxBacklogBytes: 1 << 20,
          limiter: new LogLimiter(log),
          sendWithFds: sendWithFdsOnSocket,
          request: () => ({ frame: encodeU32Frame(T.OK, 7), fds: [fd], release: () => (released++, fs.closeSync(fd)) }),
          closed: () => {},
        },
        log,
      );
      conn.start(Buffer.alloc(0));
    });
    await new Promise<void>((r) => srv.listen(file, r));
    cleanups.push(() => srv.close());
    const out = await new Promise<string>((resolve, reject) =>
      execFile('python3', ['-c', CLIENT, file, encodeRead(7, 0).toString('hex')], { timeout: 10_000 }, (e, stdout) =>
        e ? reject(e) : resolve(stdout),
      ),
    );
    expect(out.trim()).toBe(`${encodeU32Frame(T.OK, 7).toString('hex')} 1`);
    expect(fs.readFileSync(target, 'utf8')).toBe('written through the fd');
    expect(released).toBe(1);
  });
});
