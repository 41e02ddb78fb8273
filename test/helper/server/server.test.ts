/**
 * HelperServer on a real Unix socket: the first 4 bytes choose the protocol (the v2 magic goes to the
 * v2 handler with what followed it; anything else is served as legacy requests, answered from the
 * fake host's MSR files), and the connection cap closes what comes past it while the others are served.
 */
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { pino } from 'pino';
import { HelperServer, lateV2Handler, type HelperServerOptions } from '../../../src/helper/server/server.js';
import { openListener } from '../../../src/helper/server/listener.js';
import { MsrDevice } from '../../../src/msr/device.js';
import { MSR_RAPL_POWER_UNIT } from '../../../src/msr/registers.js';
import { encodeLegacyRequest, LEGACY_REPLY_SIZE, V2_MAGIC } from '../../../src/protocol/legacy.js';
import type { PeerCredentials } from '../../../src/os/libc/sockets.js';
import { FakeHost, legacyOnFakeHost } from '../../support/fake-host.js';
import { waitFor } from '../../support/wait.js';

const POWER_UNIT = 0xa0e03n;
const log = pino({ level: 'silent' });
const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** A server on a fresh socket path over a fake host (two CPUs, package 0). */
async function serve(
  o: Partial<Pick<HelperServerOptions, 'v2Handler' | 'maxConnections'>> = {},
): Promise<{ server: HelperServer; socketPath: string }> {
  const fake = new FakeHost();
  fake.writeRapl({ powerUnit: POWER_UNIT });
  const device = new MsrDevice(fake.msrPathTemplate);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-server-'));
  const socketPath = path.join(dir, 'helper.sock');
  const legacy = legacyOnFakeHost(fake, device, log);
  const listener = await openListener({ path: socketPath });
  const server = new HelperServer({ listener, legacy, logger: log, ...o });
  server.serve();
  cleanups.push(async () => {
    await server.close();
    device.close();
    fake.cleanup();
    fs.rmSync(dir, { recursive: true, force: true });
  });
  return { server, socketPath };
}

interface Client {
  socket: net.Socket;
  received(): Buffer;
  closed: Promise<void>;
}

function connect(socketPath: string): Promise<Client> {
  return new Promise((resolve, reject) => {
    const socket = net.connect({ path: socketPath }, () => resolve({ socket, received: () => got, closed }));
    let got = Buffer.alloc(0);
    socket.on('data', (d: Buffer) => (got = Buffer.concat([got, d])));
    socket.once('error', reject);
    const closed = new Promise<void>((r) => socket.once('close', () => r()));
    cleanups.push(() => void socket.destroy());
  });
}

/** The power unit MSR of CPU 0, asked for by one of our own threads. */
const powerUnitRequest = () => encodeLegacyRequest({ msr: MSR_RAPL_POWER_UNIT, cpu: 0, tid: process.pid });

async function legacyAnswered(c: Client, times = 1): Promise<void> {
  c.socket.write(Buffer.concat(Array.from({ length: times }, powerUnitRequest)));
  await waitFor(() => c.received().length === times * LEGACY_REPLY_SIZE, 'legacy replies');
  for (let i = 0; i < times; i++) expect(c.received().readBigUInt64LE(i * LEGACY_REPLY_SIZE)).toBe(POWER_UNIT);
}

describe('HelperServer protocol choice', () => {
  it('hands a connection that starts with the v2 magic to the v2 handler, with the bytes after it and the peer', async () => {
    const handed: { peer: PeerCredentials; rest: Buffer }[] = [];
    const { socketPath } = await serve({
      v2Handler: (socket, peer, rest) => {
        handed.push({ peer, rest: Buffer.from(rest) });
        socket.write('ok');
      },
    });
    const c = await connect(socketPath);
    // The magic split over two writes: the server waits for 4 bytes before it chooses.
    c.socket.write(V2_MAGIC.subarray(0, 2));
    await new Promise((r) => setTimeout(r, 30));
    expect(handed).toHaveLength(0);
    c.socket.write(Buffer.concat([V2_MAGIC.subarray(2), Buffer.from('xyz')]));
    await waitFor(() => c.received().toString() === 'ok', 'the v2 handler answered');
    expect(handed).toHaveLength(1);
    expect(handed[0]!.rest.toString()).toBe('xyz');
    expect(handed[0]!.peer).toEqual({ pid: process.pid, uid: process.getuid!(), gid: process.getgid!() });
  });

  it('serves a connection that starts with anything else as legacy requests, never calling the v2 handler', async () => {
    let v2Calls = 0;
    const { socketPath } = await serve({ v2Handler: () => v2Calls++ });
    const c = await connect(socketPath);
    await legacyAnswered(c, 3);
    expect(v2Calls).toBe(0);
  });

  it('closes a legacy connection asking for an MSR it does not allow, without a reply', async () => {
    const { socketPath } = await serve();
    const c = await connect(socketPath);
    c.socket.write(encodeLegacyRequest({ msr: 0x10, cpu: 0, tid: process.pid }));
    await c.closed;
    expect(c.received().length).toBe(0);
  });
});

describe('HelperServer connection cap', () => {
  it('closes a connection past maxConnections at once, serves the others, and takes a new one once a place is free', async () => {
    const { server, socketPath } = await serve({ maxConnections: 2 });
    const [a, b] = [await connect(socketPath), await connect(socketPath)];
    await legacyAnswered(a);
    await legacyAnswered(b);
    expect(server.connections).toBe(2);

    const over = await connect(socketPath);
    over.socket.write(powerUnitRequest());
    await over.closed;
    expect(over.received().length).toBe(0);
    // The two served go on being served.
    a.socket.write(powerUnitRequest());
    await waitFor(() => a.received().length === 2 * LEGACY_REPLY_SIZE, 'a still served');

    a.socket.destroy();
    await waitFor(() => server.connections === 1, 'a place freed');
    const next = await connect(socketPath);
    await legacyAnswered(next);
    expect(server.connections).toBe(2);
  });
});

describe('a v2 handler bound late (lateV2Handler: a restart serves legacy clients before the v2 service is set up)', () => {
  it('serves legacy requests while unbound, holds a v2 connection with every byte it sent, and hands it over once bound', async () => {
    const late = lateV2Handler();
    const { socketPath } = await serve({ v2Handler: late.handler });
    const v2 = await connect(socketPath);
    v2.socket.write(Buffer.concat([V2_MAGIC, Buffer.from('abc')]));
    await waitFor(() => late.held === 1, 'the v2 connection to be held');
    v2.socket.write('def');
    const legacy = await connect(socketPath);
    await legacyAnswered(legacy, 2);
    await new Promise((r) => setTimeout(r, 30));
    expect(v2.received().length).toBe(0);
    // The real handler echoes what it is given and what comes after, as a v2 connection reads on.
    late.bind((socket, _peer, rest) => {
      socket.write(rest);
      socket.on('data', (d: Buffer) => socket.write(d));
      socket.resume();
    });
    expect(late.held).toBe(0);
    await waitFor(() => v2.received().toString() === 'abcdef', 'the held bytes echoed once bound');
    v2.socket.write('g');
    await waitFor(() => v2.received().toString() === 'abcdefg', 'later bytes reaching the bound handler');
  });

  it('skips a held connection its client closed before the handler was bound', async () => {
    const late = lateV2Handler();
    const { socketPath } = await serve({ v2Handler: late.handler });
    const v2 = await connect(socketPath);
    v2.socket.write(V2_MAGIC);
    await waitFor(() => late.held === 1, 'the v2 connection to be held');
    v2.socket.destroy();
    await new Promise((r) => setTimeout(r, 50));
    let calls = 0;
    late.bind(() => calls++);
    expect(calls).toBe(0);
  });
});
