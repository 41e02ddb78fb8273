import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, test } from 'vitest';
import { QmpClient, type QmpError, vmSpecFromQmp } from '../../src/client/qmp.js';
import { threadGroupOf } from '../../src/os/vm-threads.js';
import { readQemuName } from '../../src/discovery/qemu-name.js';
import { qemuMissing, startQemu, vcpuThreads, type QemuGuest } from '../support/qemu.js';

describe('QMP client against a real QEMU', () => {
  let g: QemuGuest | null = null;
  const why = qemuMissing();
  beforeAll(async () => {
    if (!why) g = await startQemu({ mode: 'i', smp: 4, sockets: 2, name: 'qmp-test-vm' });
  });
  afterAll(async () => {
    await g?.stop();
  });

  test('negotiates, queries vCPUs and name, peer pid is QEMU', async (ctx) => {
    if (why || !g) return ctx.skip(why ?? 'no guest');
    const c = await QmpClient.connect(g.qmpPath);
    try {
      expect(await c.execute('query-version')).toMatchObject({ qemu: { major: expect.any(Number), minor: expect.any(Number) } });
      expect(c.peerCredentials().pid).toBe(g.pid);
      const cpus = await c.queryCpus();
      expect(cpus.map((x) => x.threadId)).toEqual(vcpuThreads(g.pid));
      expect(cpus.map((x) => x.socketId)).toEqual([0, 0, 1, 1]);
      for (const x of cpus) expect(threadGroupOf('/proc', x.threadId)).toBe(g.pid);
      expect(await c.queryName()).toBe('qmp-test-vm');
      await expect(c.execute('no-such-command')).rejects.toMatchObject({ errorClass: 'CommandNotFound' });
      expect(await c.execute('query-status')).toMatchObject({ status: 'running' });
    } finally {
      c.close();
    }
  });

  test('vmSpecFromQmp', async (ctx) => {
    if (why || !g) return ctx.skip(why ?? 'no guest');
    const spec = await vmSpecFromQmp(g.qmpPath, '/proc');
    const t = vcpuThreads(g.pid);
    expect(spec.pid).toBe(g.pid);
    expect(spec.name).toBe('qmp-test-vm');
    // What the daemon records for a v2 REGISTER, which carries no name: QEMU's -name from /proc.
    expect(readQemuName('/proc', g.pid)).toBe('qmp-test-vm');
    expect(spec.vcpus).toEqual([
      { tid: t[0], vpkg: 0 },
      { tid: t[1], vpkg: 0 },
      { tid: t[2], vpkg: 1 },
      { tid: t[3], vpkg: 1 },
    ]);
    const stat = fs.readFileSync(`/proc/${g.pid}/stat`, 'utf8');
    expect(spec.starttime).toBe(Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19]));
  });
});

/** A fake QMP server on a real Unix socket, scripted per connection. */
describe('QMP client against hostile servers', () => {
  let dir: string;
  const servers: net.Server[] = [];
  beforeAll(() => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-qmp-'));
  });
  afterEach(async () => {
    for (const s of servers.splice(0)) await new Promise((r) => s.close(r));
  });
  afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

  const GREETING = '{"QMP":{"version":{"qemu":{"micro":0,"minor":1,"major":9},"package":""},"capabilities":[]}}\n';
  let n = 0;
  async function serve(onConn: (s: net.Socket, lines: AsyncIterable<string>) => void | Promise<void>): Promise<string> {
    const p = path.join(dir, `s${n++}.sock`);
    const server = net.createServer((s) => {
      s.on('error', () => {});
      async function* lines(): AsyncGenerator<string> {
        let buf = '';
        try {
          for await (const d of s) {
            buf += String(d);
            let i: number;
            while ((i = buf.indexOf('\n')) >= 0) {
              yield buf.slice(0, i);
              buf = buf.slice(i + 1);
            }
          }
        } catch {
          /* the client hung up: that is what several tests do */
        }
      }
      void onConn(s, lines());
    });
    servers.push(server);
    await new Promise<void>((r) => server.listen(p, r));
    return p;
  }
  /** Replies {"return":{}} to qmp_capabilities with its id, then `then` for later commands. */
  const negotiated =
    (then: (s: net.Socket, msg: { execute: string; id: unknown }) => void) => async (s: net.Socket, lines: AsyncIterable<string>) => {
      s.write(GREETING);
      for await (const l of lines) {
        const msg = JSON.parse(l) as { execute: string; id: unknown };
        if (msg.execute === 'qmp_capabilities') s.write(`${JSON.stringify({ return: {}, id: msg.id })}\n`);
        else then(s, msg);
      }
    };

  test('missing socket, plain file, nobody listening: errors name the fix', async () => {
    await expect(QmpClient.connect(path.join(dir, 'nope.sock'))).rejects.toThrow(/does not exist: start QEMU with -qmp unix:/);
    const f = path.join(dir, 'file');
    fs.writeFileSync(f, '');
    await expect(QmpClient.connect(f)).rejects.toThrow(/not a Unix socket/);
    const p = await serve(() => {});
    await new Promise((r) => servers.pop()!.close(r)); // closing removes the socket file
    await expect(QmpClient.connect(p)).rejects.toThrow(/does not exist|nothing is listening/);
  });

  test('no greeting: timeout saying it may not be a QMP socket', async () => {
    const p = await serve(() => {});
    await expect(QmpClient.connect(p, { timeoutMs: 300 })).rejects.toThrow(/no QMP greeting/);
  });

  test('garbage instead of a greeting', async () => {
    const p = await serve((s) => void s.write('SSH-2.0-OpenSSH_9.2\r\n'));
    await expect(QmpClient.connect(p)).rejects.toThrow(/not JSON.*-qmp socket/);
  });

  test('JSON that is not a greeting', async () => {
    const p = await serve((s) => void s.write('{"hello":1}\n'));
    await expect(QmpClient.connect(p)).rejects.toThrow(/not a QMP greeting/);
  });

  test('a huge line without newline is cut off', async () => {
    const p = await serve((s) => {
      s.write(GREETING);
      s.write('x'.repeat(300_000));
    });
    // the greeting arrives, then the oversize line kills negotiation
    await expect(QmpClient.connect(p, { maxLine: 100_000 })).rejects.toThrow(/longer than 100000/);
  });

  test('error replies, wrong shapes, events and late replies', async () => {
    const p = await serve(
      negotiated((s, msg) => {
        s.write('{"event":"RESUME","timestamp":{"seconds":1,"microseconds":2}}\n');
        s.write(`{"return":{},"id":"not-ours"}\n`);
        if (msg.execute === 'query-cpus-fast') s.write(`${JSON.stringify({ return: [{ 'thread-id': 'x' }], id: msg.id })}\n`);
        else if (msg.execute === 'query-name') s.write(`${JSON.stringify({ return: 'nope', id: msg.id })}\n`);
        else if (msg.execute === 'weird') s.write(`${JSON.stringify({ id: msg.id })}\n`);
        else s.write(`${JSON.stringify({ error: { class: 'GenericError', desc: 'denied' }, id: msg.id })}\n`);
      }),
    );
    const c = await QmpClient.connect(p);
    try {
      await expect(c.execute('stop')).rejects.toThrow('QMP error GenericError: denied');
      await expect(c.queryCpus()).rejects.toThrow(/no valid thread-id/);
      expect(await c.queryName()).toBeUndefined();
      await expect(c.execute('weird')).rejects.toThrow(/neither return nor error/);
      expect(await c.execute('stop').catch((e: QmpError) => e.errorClass)).toBe('GenericError'); // still usable
    } finally {
      c.close();
    }
  });

  test('command timeout; then the server closing fails pending commands', async () => {
    let sock: net.Socket | null = null;
    const p = await serve(negotiated((s) => void (sock = s)));
    const c = await QmpClient.connect(p);
    await expect(c.execute('query-status', undefined, 200)).rejects.toMatchObject({ errorClass: 'Timeout' });
    const pending = c.execute('query-status', undefined, 5000);
    await new Promise((r) => setTimeout(r, 50));
    (sock as net.Socket | null)?.destroy();
    await expect(pending).rejects.toMatchObject({ errorClass: 'Closed' });
    await expect(c.execute('x')).rejects.toMatchObject({ errorClass: 'Closed' });
    c.close();
  });

  test('vmSpecFromQmp refuses a socket whose owner is not the QEMU of the vCPU threads', async () => {
    // Our own process serves it; the "vCPU" is pid 1, which is not our thread.
    const p = await serve(
      negotiated((s, msg) => {
        if (msg.execute === 'query-cpus-fast')
          s.write(`${JSON.stringify({ return: [{ 'cpu-index': 0, 'thread-id': 1, props: { 'socket-id': 0 } }], id: msg.id })}\n`);
        else s.write(`${JSON.stringify({ return: {}, id: msg.id })}\n`);
      }),
    );
    await expect(vmSpecFromQmp(p, '/proc')).rejects.toThrow(
      new RegExp(`owner \\(pid ${process.pid}\\) is not the QEMU.*thread 1 belongs to process 1`),
    );
  });
});
