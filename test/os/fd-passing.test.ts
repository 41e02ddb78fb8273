/**
 * fds over real AF_UNIX socket pairs (SCM_RIGHTS), and sealed memfds: the os/libc/ calls the
 * statistics fd and the restart state are handed over with.
 */
import fs from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';
import { closeFd } from '../../src/os/libc/fds.js';
import { isCloseOnExec } from '../support/fds.js';
import { addSeals, F_SEAL_GROW, F_SEAL_SEAL, F_SEAL_SHRINK, F_SEAL_WRITE, getSeals, memfdCreate } from '../../src/os/libc/memfd-mmap.js';
import {
  cmsgLenForFds,
  cmsgSpaceForFds,
  decodeScmRights,
  encodeScmRights,
  MSG_DONTWAIT,
  recvWithFds,
  sendFds,
  socketpair,
  SOCK_DGRAM,
} from '../../src/os/libc/sockets.js';

const opened: number[] = [];
function track<T extends number[]>(fds: T): T {
  opened.push(...fds);
  return fds;
}
afterEach(() => {
  for (const fd of opened.splice(0)) closeFd(fd);
});

/** The fds this process holds, as /proc/self/fd lists them (the listing's own fd comes and goes). */
function openFdCount(): number {
  return fs.readdirSync('/proc/self/fd').length;
}

/** The fd works: bytes written through it come out of `peer`, the other end of its socket pair. */
function expectWorking(fd: number, peer: number, text: string): void {
  expect(fs.writeSync(fd, text)).toBe(text.length);
  const got = Buffer.alloc(64);
  expect(got.subarray(0, fs.readSync(peer, got)).toString()).toBe(text);
}

describe('SCM_RIGHTS control messages', () => {
  it('cmsg sizes follow CMSG_LEN and CMSG_SPACE of x86_64 (16-byte header, aligned to 8)', () => {
    expect([cmsgLenForFds(1), cmsgSpaceForFds(1)]).toEqual([20, 24]);
    expect([cmsgLenForFds(2), cmsgSpaceForFds(2)]).toEqual([24, 24]);
    expect([cmsgLenForFds(3), cmsgSpaceForFds(3)]).toEqual([28, 32]);
    expect(decodeScmRights(encodeScmRights([7, 8, 9]), 32)).toEqual([7, 8, 9]);
  });

  it('decodeScmRights stops at a header that claims more than the buffer holds', () => {
    const c = encodeScmRights([5, 6]);
    c.writeBigUInt64LE(1000n, 0);
    expect(decodeScmRights(c, c.length)).toEqual([]);
    expect(decodeScmRights(encodeScmRights([5]), 10)).toEqual([]);
  });
});

describe('sendFds and recvWithFds', () => {
  it('a frame with 1 fd arrives with a working, close-on-exec fd', () => {
    const [a, b] = track(socketpair());
    const [p, q] = track(socketpair());
    expect(sendFds(a, Buffer.from('one'), [p])).toBe(3);
    const r = recvWithFds(b, 16, 1);
    track(r.fds);
    expect(r.data.toString()).toBe('one');
    expect(r.truncated).toBe(false);
    expect(r.fds).toHaveLength(1);
    expect(r.fds[0]).not.toBe(p);
    expect(isCloseOnExec(r.fds[0]!)).toBe(true);
    expectWorking(r.fds[0]!, q, 'through the received fd');
  });

  it('a frame with 3 fds arrives with three working fds, in the order sent', () => {
    const [a, b] = track(socketpair());
    const pairs = [track(socketpair()), track(socketpair()), track(socketpair())];
    sendFds(
      a,
      Buffer.from('three'),
      pairs.map(([x]) => x),
    );
    const r = recvWithFds(b, 16, 3);
    track(r.fds);
    expect(r.data.toString()).toBe('three');
    expect(r.fds).toHaveLength(3);
    r.fds.forEach((fd, i) => {
      expect(isCloseOnExec(fd)).toBe(true);
      expectWorking(fd, pairs[i]![1], `fd ${i}`);
    });
  });

  it('a receiver that allows 1 fd gets 1 when 3 are sent, truncated true, and holds no more fds', () => {
    const [a, b] = track(socketpair());
    const sent = [socketpair(), socketpair(), socketpair()];
    sendFds(
      a,
      Buffer.from('x'),
      sent.map(([x]) => x),
    );
    for (const [x] of sent) closeFd(x);
    track(sent.map(([, y]) => y));
    const before = openFdCount();
    const r = recvWithFds(b, 16, 1);
    track(r.fds);
    expect(r.fds).toHaveLength(1);
    expect(r.truncated).toBe(true);
    expect(openFdCount()).toBe(before + 1);
    expectWorking(r.fds[0]!, sent[0]![1], 'first');
  });

  it('a receiver that allows 1 fd gets 1 when 2 are sent (the second fits the cmsg padding), truncated true', () => {
    const [a, b] = track(socketpair());
    const sent = [socketpair(), socketpair()];
    sendFds(
      a,
      Buffer.from('x'),
      sent.map(([x]) => x),
    );
    for (const [x] of sent) closeFd(x);
    track(sent.map(([, y]) => y));
    const before = openFdCount();
    const r = recvWithFds(b, 16, 1);
    track(r.fds);
    expect(r).toMatchObject({ truncated: true });
    expect(r.fds).toHaveLength(1);
    expect(openFdCount()).toBe(before + 1);
  });

  it('a receiver that allows no fd holds none after a message that carried two', () => {
    const [a, b] = track(socketpair());
    const [p, q] = track(socketpair());
    sendFds(a, Buffer.from('y'), [p, q]);
    const before = openFdCount();
    const r = recvWithFds(b, 16, 0);
    expect(r).toMatchObject({ fds: [], truncated: true });
    expect(r.data.toString()).toBe('y');
    expect(openFdCount()).toBe(before);
  });

  it('a datagram of fds with no data arrives as empty data with its fds', () => {
    const [a, b] = track(socketpair(SOCK_DGRAM));
    const [p, q] = track(socketpair());
    // On a stream socket fds need a byte to ride on; sendFds refuses rather than lose them.
    expect(() => sendFds(track(socketpair())[0], Buffer.alloc(0), [p])).toThrow(/at least one byte/);
    sendFds(a, Buffer.alloc(0), [p]);
    const r = recvWithFds(b, 16, 1);
    track(r.fds);
    expect(r.data.length).toBe(0);
    expectWorking(r.fds[0]!, q, 'no data');
  });

  it('a datagram longer than maxBytes is reported truncated', () => {
    const [a, b] = track(socketpair(SOCK_DGRAM));
    sendFds(a, Buffer.from('0123456789'), []);
    const r = recvWithFds(b, 4, 1);
    expect(r).toMatchObject({ fds: [], truncated: true });
    expect(r.data.toString()).toBe('0123');
  });

  it('nothing to read with MSG_DONTWAIT fails with EAGAIN, and a full send buffer says so', () => {
    const [a, b] = track(socketpair());
    expect(() => recvWithFds(b, 16, 1, MSG_DONTWAIT)).toThrow(/recvmsg: EAGAIN/);
    const big = Buffer.alloc(1 << 16);
    let err: unknown;
    for (let i = 0; i < 1000 && !err; i++) {
      try {
        sendFds(a, big, [], MSG_DONTWAIT);
      } catch (e) {
        err = e;
      }
    }
    expect(err).toMatchObject({ code: 'EAGAIN', message: expect.stringMatching(/send buffer is full/) });
  });

  it('a bad fd fails with the errno named (EBADF), more than SCM_MAX_FD fds are refused', () => {
    const [a] = track(socketpair());
    expect(() => sendFds(a, Buffer.from('z'), [987654])).toThrow(/sendmsg: EBADF/);
    expect(() => sendFds(a, Buffer.from('z'), new Array<number>(254).fill(0))).toThrow(/at most 253/);
    expect(() => recvWithFds(-1, 1, 1)).toThrow(/recvmsg: EBADF/);
  });
});

describe('memfd seals', () => {
  it('a sealed memfd refuses write, grow and shrink, and further seals', () => {
    const fd = memfdCreate('vmsr-test');
    track([fd]);
    expect(isCloseOnExec(fd)).toBe(true);
    fs.writeSync(fd, 'state', 0);
    expect(getSeals(fd)).toBe(0);
    addSeals(fd, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL);
    expect(getSeals(fd)).toBe(F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL);
    expect(() => fs.writeSync(fd, 'X', 0)).toThrow(/EPERM/);
    expect(() => fs.ftruncateSync(fd, 100)).toThrow(/EPERM/);
    expect(() => fs.ftruncateSync(fd, 1)).toThrow(/EPERM/);
    expect(() => addSeals(fd, F_SEAL_WRITE)).toThrow(/F_ADD_SEALS\): EPERM/);
    const got = Buffer.alloc(8);
    expect(got.subarray(0, fs.readSync(fd, got, 0, 8, 0)).toString()).toBe('state');
  });

  it('a file that is not a memfd has no seals to read (EINVAL)', () => {
    const fd = fs.openSync('/proc/self/stat', 'r');
    track([fd]);
    expect(() => getSeals(fd)).toThrow(/F_GET_SEALS\): EINVAL/);
  });
});
