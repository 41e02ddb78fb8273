/**
 * ConnectionSlots on a real node:http server and real sockets: the oldest idle connection of the
 * owner holding the most slots makes room, and a new connection is closed at once only when its own
 * owner holds the most and has every slot busy. Owners here are source addresses (ownerBySource):
 * each client connects from an address of its own in 127.0.0.0/8.
 * The attack itself runs against the real exporter in test/hostile/idle-connections-block-no-scrape.test.ts.
 */
import http from 'node:http';
import net, { type AddressInfo } from 'node:net';
import { afterEach, describe, expect, test } from 'vitest';
import { ConnectionSlots } from '../../src/exporter/connection-slots.js';
import { ownerBySource } from '../../src/exporter/connection-owner.js';

const MAX = 3;
const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanups.splice(0).reverse()) c();
});

/**
 * A server whose /hang requests are never answered and whose other requests get "ok"; a request
 * for /refused-hang is marked refused (as a wrong password is) and never answered.
 */
async function server(limits = { max: MAX, idleMs: 10_000, requestMs: 10_000 }): Promise<{ port: number; open: () => Promise<number> }> {
  const s = http.createServer((req, res) => {
    if (req.url === '/refused-hang') slots.markRefused(req.socket);
    else if (req.url !== '/hang') res.end('ok');
  });
  const slots: ConnectionSlots = new ConnectionSlots(s, limits, ownerBySource);
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  cleanups.push(() => {
    s.closeAllConnections();
    s.close();
  });
  const open = () => new Promise<number>((r, j) => s.getConnections((e, n) => (e ? j(e) : r(n))));
  return { port: (s.address() as AddressInfo).port, open };
}

/** A client connected from `from` (an address of the loopback network: its owner). */
function connect(port: number, from = '127.0.0.1'): Promise<net.Socket & { closedAt?: number }> {
  return new Promise((resolve) => {
    const c: net.Socket & { closedAt?: number } = net.connect({ port, host: '127.0.0.1', localAddress: from }, () => resolve(c));
    c.on('error', () => {});
    c.on('close', () => (c.closedAt = Date.now()));
    cleanups.push(() => c.destroy());
  });
}

const settle = () => new Promise((r) => setTimeout(r, 100));

describe('ConnectionSlots', () => {
  test.each([2, 10, 2000])(
    'a connection pipelining %i requests is closed, at most its first served; one sending them one at a time is served each',
    async (n) => {
      const { port, open } = await server();
      const piped = await connect(port);
      let got = '';
      piped.on('data', (d: Buffer) => (got += d.toString()));
      piped.write('GET / HTTP/1.1\r\nHost: x\r\n\r\n'.repeat(n));
      const end = Date.now() + 10_000;
      while (piped.closedAt === undefined && Date.now() < end) await settle();
      expect(piped.closedAt, 'the pipelining connection closed').toBeDefined();
      expect(got.split('HTTP/1.1 200').length - 1).toBeLessThanOrEqual(1);
      expect(await open()).toBe(0);
      const polite = await connect(port);
      for (let i = 0; i < 5; i++) {
        const reply = new Promise<string>((r) => polite.once('data', (d: Buffer) => r(d.toString())));
        polite.write('GET / HTTP/1.1\r\nHost: x\r\n\r\n');
        expect(await reply).toMatch(/^HTTP\/1\.1 200[\s\S]*ok$/);
      }
      expect(polite.closedAt).toBeUndefined();
      expect(await open()).toBe(1);
    },
  );

  test('a new connection evicts the connection idle the longest when the slots are full', async () => {
    const { port, open } = await server();
    const idle = [];
    for (let i = 0; i < MAX; i++) {
      idle.push(await connect(port));
      await settle();
    }
    const fresh = await connect(port);
    await settle();
    expect(idle.map((c) => c.closedAt !== undefined)).toEqual([true, false, false]);
    expect(fresh.closedAt).toBeUndefined();
    expect(await open()).toBe(MAX);
  });

  test('a new connection is closed at once when every slot has a request in progress, and not an in-progress one', async () => {
    const { port, open } = await server();
    const busy = [];
    for (let i = 0; i < MAX; i++) {
      const c = await connect(port);
      c.write('GET /hang HTTP/1.1\r\nHost: x\r\n\r\n');
      busy.push(c);
    }
    await settle();
    const late = await connect(port);
    await settle();
    expect(late.closedAt).toBeDefined();
    expect(busy.every((c) => c.closedAt === undefined)).toBe(true);
    expect(await open()).toBe(MAX);
  });

  test('a request not answered within requestMs is closed', async () => {
    const { port, open } = await server({ max: MAX, idleMs: 10_000, requestMs: 300 });
    const c = await connect(port);
    const t0 = Date.now();
    c.write('GET /hang HTTP/1.1\r\nHost: x\r\n\r\n');
    await new Promise((r) => c.once('close', r));
    expect(Date.now() - t0).toBeGreaterThanOrEqual(250);
    // At requestMs (300), not at idleMs (10 s): far above the first for a busy machine, below the second.
    expect(Date.now() - t0, 'the hanging request closed at requestMs').toBeLessThan(8_000);
    expect(await open()).toBe(0);
  });

  test('a connection refused its credentials makes room first: idle before any idle one, in progress before closing the new one', async () => {
    const { port, open } = await server();
    const idle = await connect(port);
    await settle();
    const busy = await connect(port);
    busy.write('GET /hang HTTP/1.1\r\nHost: x\r\n\r\n');
    const refused = await connect(port);
    refused.write('GET /refused-hang HTTP/1.1\r\nHost: x\r\n\r\n');
    await settle();
    // Idle refused first, then idle, then refused with its refusal in progress: here the idle one goes.
    const first = await connect(port);
    await settle();
    expect([idle, busy, refused].map((c) => c.closedAt !== undefined)).toEqual([true, false, false]);
    first.write('GET /hang HTTP/1.1\r\nHost: x\r\n\r\n');
    await settle();
    // Every slot busy now: the refused one makes room, not the new connection closed at once.
    const second = await connect(port);
    await settle();
    expect([busy, refused, first, second].map((c) => c.closedAt !== undefined)).toEqual([false, true, false, false]);
    expect(await open()).toBe(MAX);
  });

  test('a new connection evicts the idle connection of the owner holding the most slots, not an older idle one of another owner', async () => {
    const { port, open } = await server();
    const a = await connect(port, '127.0.0.2');
    await settle();
    const b = [await connect(port, '127.0.0.3'), await connect(port, '127.0.0.3')];
    await settle();
    const fresh = await connect(port, '127.0.0.4');
    await settle();
    expect([a, ...b, fresh].map((c) => c.closedAt !== undefined)).toEqual([false, true, false, false]);
    expect(await open()).toBe(MAX);
  });

  test("an owner holding more slots than the new connection's loses its oldest request in progress when it has none idle", async () => {
    const { port, open } = await server();
    const hog = [];
    for (let i = 0; i < MAX; i++) {
      const c = await connect(port, '127.0.0.3');
      c.write('GET /hang HTTP/1.1\r\nHost: x\r\n\r\n');
      hog.push(c);
      await settle();
    }
    const fresh = await connect(port, '127.0.0.2');
    await settle();
    expect([...hog, fresh].map((c) => c.closedAt !== undefined)).toEqual([true, false, false, false]);
    // The hog's next connection, its owner holding the most and none idle, is closed at once.
    const more = await connect(port, '127.0.0.3');
    await settle();
    expect(more.closedAt).toBeDefined();
    expect(await open()).toBe(MAX);
  });

  test('an owner reopening every connection it loses evicts only its own while another owner waits to send its request', async () => {
    const { port } = await server();
    const scraper = await connect(port, '127.0.0.2');
    let reopened = 0;
    const hold = (): void => {
      void connect(port, '127.0.0.3').then((c) => c.once('close', () => reopened++ < 200 && hold()));
    };
    for (let i = 0; i < MAX + 2; i++) hold();
    const deadline = Date.now() + 30_000;
    while (reopened < 200 && Date.now() < deadline) await settle();
    expect(reopened, 'the hoarder to have lost and reopened 200 connections').toBeGreaterThanOrEqual(200);
    expect(scraper.closedAt).toBeUndefined();
  });
});
