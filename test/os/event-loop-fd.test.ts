/**
 * This process's event loop as the busy poll sees it (helper/server/busy-poll.ts): the epoll fd found through a connection
 * it reads, whose readiness shows a request the loop has not read yet, and nothing for an fd no loop watches.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { eventLoopFd } from '../../src/os/event-loop-fd.js';
import { closeFd, epollAdd, epollCreate, epollSoleReady } from '../../src/os/libc/fds.js';
import { socketFd } from '../../src/os/libc/sockets.js';

const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanups.splice(0).reverse()) c();
});

/** A connected pair on a real Unix socket: `served` is read by this process's loop (resumed, a turn passed). */
async function servedConnection(): Promise<{ served: net.Socket; client: net.Socket }> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-loopfd-'));
  const server = net.createServer();
  await new Promise<void>((r) => server.listen(path.join(dir, 's.sock'), r));
  const accepted = new Promise<net.Socket>((r) => server.once('connection', r));
  const client = net.connect(path.join(dir, 's.sock'));
  const served = await accepted;
  served.on('data', () => undefined);
  cleanups.push(() => {
    client.destroy();
    served.destroy();
    server.close();
    fs.rmSync(dir, { recursive: true, force: true });
  });
  await new Promise((r) => setTimeout(r, 50)); // a few turns: the loop now watches the connection
  return { served, client };
}

describe('eventLoopFd', () => {
  test('finds the epoll fd watching a connection the loop reads, which shows a request waiting unread', async () => {
    const { served, client } = await servedConnection();
    const fd = socketFd(served)!;
    const loop = eventLoopFd(fd);
    expect(loop).not.toBeNull();
    expect(fs.readlinkSync(`/proc/self/fd/${loop}`)).toBe('anon_inode:[eventpoll]');
    const got = new Promise<Buffer>((r) => served.once('data', r));
    client.write('x');
    // The loop cannot read it while this turn runs; the test runner's own channels may be ready beside it ('several').
    const end = Date.now() + 10_000;
    let ready = epollSoleReady(loop!);
    while (ready !== fd && ready !== 'several' && Date.now() < end) ready = epollSoleReady(loop!);
    expect([fd, 'several'], 'the loop with a byte waiting').toContain(ready);
    expect((await got).toString(), 'the loop read it all the same (the look took nothing)').toBe('x');
  });

  test('is null for an fd no loop of this process watches (a file, a closed fd)', async () => {
    await servedConnection();
    const file = fs.openSync(fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-loopfd-')) + '/f', 'w');
    cleanups.push(() => fs.closeSync(file));
    expect(eventLoopFd(file)).toBeNull();
    expect(eventLoopFd(1 << 20)).toBeNull();
  });
});

describe('epollSoleReady', () => {
  test('says nothing, the one ready entry, or several, and takes nothing from a level-triggered set', () => {
    const ep = epollCreate();
    expect(ep).toBeGreaterThanOrEqual(0);
    const [r1, w1] = pipeFds();
    const [r2, w2] = pipeFds();
    cleanups.push(() => [ep, r1, w1, r2, w2].forEach(closeFd));
    expect(epollAdd(ep, r1, 101)).toBe(0);
    expect(epollAdd(ep, r2, 102)).toBe(0);
    expect(epollSoleReady(ep), 'nothing written').toBe('nothing');
    fs.writeSync(w1, 'y');
    expect(epollSoleReady(ep), 'a byte in the first pipe').toBe(101);
    expect(epollSoleReady(ep), 'still there for the set’s owner').toBe(101);
    fs.writeSync(w2, 'z');
    expect(epollSoleReady(ep), 'a byte in each').toBe('several');
    fs.readSync(r1, Buffer.alloc(1));
    expect(epollSoleReady(ep), 'the first read').toBe(102);
    fs.readSync(r2, Buffer.alloc(1));
    expect(epollSoleReady(ep), 'both read').toBe('nothing');
  });
});

/** A pipe's two fds (Node has no pipe(2)): a FIFO opened both ways. */
function pipeFds(): [number, number] {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-loopfd-'));
  const fifo = path.join(dir, 'p');
  execFileSync('mkfifo', [fifo]);
  const r = fs.openSync(fifo, fs.constants.O_RDONLY | fs.constants.O_NONBLOCK);
  const w = fs.openSync(fifo, fs.constants.O_WRONLY);
  cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
  return [r, w];
}
