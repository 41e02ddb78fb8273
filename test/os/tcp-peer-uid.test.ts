/**
 * TcpPeerUids against the real kernel: real TCP connections over loopback, from this process and
 * from a process of another uid, looked up through sock_diag.
 */
import { spawn } from 'node:child_process';
import net, { type AddressInfo } from 'node:net';
import { afterEach, describe, expect, test } from 'vitest';
import { TcpPeerUids } from '../../src/os/tcp-peer-uid.js';
import { missing } from '../support/env.js';

const NOBODY = 65534;
const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanups.splice(0).reverse()) c();
});

/** A server on `host`; resolves with its port and the first connection it accepts (as a promise). */
async function listen(host: string): Promise<{ port: number; accepted: Promise<net.Socket> }> {
  let take!: (s: net.Socket) => void;
  const accepted = new Promise<net.Socket>((r) => (take = r));
  const srv = net.createServer((s) => take(s));
  await new Promise<void>((r) => srv.listen(0, host, r));
  cleanups.push(() => srv.close());
  return { port: (srv.address() as AddressInfo).port, accepted };
}

function lookups(): TcpPeerUids {
  const u = new TcpPeerUids();
  cleanups.push(() => u.close());
  return u;
}

describe('TcpPeerUids', () => {
  for (const [family, listenOn, connectTo] of [
    ['IPv4', '127.0.0.1', '127.0.0.1'],
    ['IPv4 on a dual-stack listener (::ffff: addresses)', '::', '127.0.0.1'],
    ['IPv6', '::1', '::1'],
  ] as const) {
    test(`uidOf gives this process's uid for a connection it made itself (${family})`, async () => {
      const { port, accepted } = await listen(listenOn);
      const c = net.connect(port, connectTo);
      cleanups.push(() => c.destroy());
      const s = await accepted;
      expect(lookups().uidOf(s)).toBe(process.getuid!());
    });
  }

  test('uidOf gives the uid of another user whose process holds the other end', async (ctx) => {
    const why = missing({ root: true });
    if (why) return ctx.skip(why);
    const { port, accepted } = await listen('127.0.0.1');
    const p = spawn(process.execPath, ['-e', `require('net').connect(${port}, '127.0.0.1'); setTimeout(() => {}, 60000)`], {
      uid: NOBODY,
      gid: NOBODY,
      stdio: 'ignore',
    });
    cleanups.push(() => p.kill('SIGKILL'));
    const s = await accepted;
    expect(lookups().uidOf(s)).toBe(NOBODY);
  });

  test('uidOf gives null for a peer not on this host, and for a peer port where only a listening socket is', async () => {
    const { port } = await listen('127.0.0.1');
    const other = await listen('0.0.0.0');
    const u = lookups();
    expect(u.uidOf({ remoteAddress: '192.0.2.7', remotePort: 40_000, localAddress: '127.0.0.1', localPort: port })).toBeNull();
    // The kernel's lookup falls back to a listener on the peer's port: that is nobody's connection.
    const viaListener = { remoteAddress: '127.0.0.1', remotePort: other.port, localAddress: '127.0.0.1', localPort: port };
    expect(u.uidOf(viaListener)).toBeNull();
  });

  test('uidOf gives null for ends it cannot look up (missing, mixed families, not an address)', () => {
    const u = lookups();
    expect(u.uidOf({})).toBeNull();
    expect(u.uidOf({ remoteAddress: '::1', remotePort: 1, localAddress: '127.0.0.1', localPort: 2 })).toBeNull();
    expect(u.uidOf({ remoteAddress: 'fe80::1%eth0', remotePort: 1, localAddress: 'fe80::2%eth0', localPort: 2 })).toBeNull();
    expect(u.uidOf({ remoteAddress: 'x', remotePort: 1, localAddress: 'y', localPort: 2 })).toBeNull();
  });
});
