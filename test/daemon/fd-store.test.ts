/**
 * The fd store (FDSTORE=1 / FDSTOREREMOVE=1) on the notify socket: a real AF_UNIX datagram socket,
 * bound by a python3 child that stands in for systemd (Node has no datagram Unix sockets), receives
 * the Notifier's datagrams, reports their text and proves the fds it got work by writing through them.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { Notifier } from '../../src/helper/lifecycle/systemd.js';
import { closeFd } from '../../src/os/libc/fds.js';
import { socketpair } from '../../src/os/libc/sockets.js';

const MANAGER = `
import socket, sys, os, json
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
print('ready', flush=True)
for i in range(int(sys.argv[2])):
    msg, fds, flags, addr = socket.recv_fds(s, 4096, 16)
    for n, fd in enumerate(fds):
        os.write(fd, ('fd %d of message %d' % (n, i)).encode())
        os.close(fd)
    print(json.dumps({'text': msg.decode(), 'fds': len(fds)}), flush=True)
`;

/** Starts the stand-in manager for `messages` datagrams; resolves with its socket path and the messages it will have read. */
async function fakeManager(messages: number): Promise<{ socket: string; received: Promise<{ text: string; fds: number }[]>; dir: string }> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-fdstore-'));
  const socket = path.join(dir, 'notify');
  const child = spawn('python3', ['-c', MANAGER, socket, String(messages)], { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  await new Promise<void>((resolve, reject) => {
    const t = setInterval(() => out.startsWith('ready\n') && (clearInterval(t), resolve()), 10);
    child.once('exit', () => (clearInterval(t), reject(new Error(`manager exited: ${out}`))));
  });
  const received = new Promise<{ text: string; fds: number }[]>((resolve) =>
    child.once('exit', () =>
      resolve(
        out
          .split('\n')
          .slice(1)
          .filter(Boolean)
          .map((l) => JSON.parse(l) as { text: string; fds: number }),
      ),
    ),
  );
  return { socket, received, dir };
}

function readAll(fd: number): string {
  const b = Buffer.alloc(256);
  return b.subarray(0, fs.readSync(fd, b)).toString();
}

describe('the fd store through the notify socket', () => {
  it('storeFds sends FDSTORE=1 and FDNAME= with the fds attached, removeStoredFds FDSTOREREMOVE=1', async () => {
    const m = await fakeManager(3);
    const pairs = [socketpair(), socketpair()];
    try {
      const errors: Error[] = [];
      const n = new Notifier({ NOTIFY_SOCKET: m.socket }, (e) => errors.push(e));
      expect(n.storeFds('state', [pairs[0]![0], pairs[1]![0]])).toBe(true);
      expect(n.storeFds('stats', [pairs[0]![0]], { poll: false })).toBe(true);
      n.removeStoredFds('state');
      expect(await m.received).toEqual([
        { text: 'FDSTORE=1\nFDNAME=state', fds: 2 },
        { text: 'FDSTORE=1\nFDNAME=stats\nFDPOLL=0', fds: 1 },
        { text: 'FDSTOREREMOVE=1\nFDNAME=state', fds: 0 },
      ]);
      expect(readAll(pairs[0]![1])).toBe('fd 0 of message 0fd 0 of message 1');
      expect(readAll(pairs[1]![1])).toBe('fd 1 of message 0');
      expect(errors).toEqual([]);
    } finally {
      for (const [a, b] of pairs) {
        closeFd(a);
        closeFd(b);
      }
      fs.rmSync(m.dir, { recursive: true, force: true });
    }
  });

  it('storeFds refuses a bad name or no fds, and without NOTIFY_SOCKET sends nothing', () => {
    const n = new Notifier({});
    expect(() => n.storeFds('a:b', [0])).toThrow(/cannot store fds as 'a:b': the name it has .* a colon/);
    expect(() => n.storeFds('state', [])).toThrow(/0 fds, one message carries 1..253/);
    expect(() => n.removeStoredFds('')).toThrow(/cannot remove the stored fds '': the name it is empty/);
    expect(n.storeFds('state', [0])).toBe(false);
  });

  it('a notify socket nobody listens on is reported to onError, not thrown', () => {
    const errors: Error[] = [];
    const n = new Notifier({ NOTIFY_SOCKET: `/nonexistent-${process.pid}/notify` }, (e) => errors.push(e));
    expect(n.storeFds('state', [0])).toBe(false);
    expect(errors.map((e) => e.message)).toEqual([
      expect.stringMatching(/^cannot store fds as 'state' with systemd: sendmsg\(.*\): ENOENT/),
    ]);
  });
});
