/**
 * The legacy protocol end to end: a real helper child process, real Unix sockets, MSR values in
 * FakeHost files read through pread at offset = MSR.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { FakeHost } from '../support/fake-host.js';
import { hostArgs, LegacyClient, req, startHelper, tempDir, waitFor, type DaemonChild } from './support/daemon-process.js';
import { synthValue } from '../../src/msr/legacy-registers.js';
import { steady } from '../support/wait.js';

/**
 * The 8 bytes at file offset = MSR, what the kernel's msr driver would return. Neighbouring MSR
 * numbers overlap in a file (0x610 covers 0x611..0x617), so expectations come from the file.
 */
function at(file: string, msr: number): bigint {
  const b = Buffer.alloc(8);
  const fd = fs.openSync(file, 'r');
  try {
    fs.readSync(fd, b, 0, 8, msr);
  } finally {
    fs.closeSync(fd);
  }
  return b.readBigUInt64LE(0);
}

let UNIT = 0n;
let LIMIT = 0n;
let INFO = 0n;
let E0 = 0n;
let E1 = 0n;

describe('legacy protocol (Intel host, real daemon)', () => {
  let host: FakeHost;
  let dir: string;
  let sock: string;
  let helper: DaemonChild;
  let bystander: LegacyClient;
  let sleeper: ChildProcess;

  beforeAll(async () => {
    // cpus 0,1 in package 0, cpus 2,3 in package 1; cpu 3 offline.
    host = new FakeHost({ packages: [0, 0, 1, 1], online: [0, 1, 2] });
    for (const pkg of [0, 1]) {
      host.writePackageMsr(pkg, 0x606, 0xa1003n);
      host.writePackageMsr(pkg, 0x610, 0x78_0001_8000_03c0n);
      host.writePackageMsr(pkg, 0x614, 0x0000_0640_0000_03c0n);
      host.writePackageMsr(pkg, 0x611, pkg === 0 ? 0x1234_5678n : 0x0abc_def0n);
    }
    host.writeMsr(0, 0x10, 0xdeadn); // a register outside the allowlist, present in the file
    [UNIT, LIMIT, INFO, E0] = [0x606, 0x610, 0x614, 0x611].map((m) => at(host.msrPath(0), m)) as [bigint, bigint, bigint, bigint];
    E1 = at(host.msrPath(2), 0x611);
    // every value distinct and non-zero, so a wrong register or cpu cannot pass
    expect(new Set([UNIT, LIMIT, INFO, E0, E1, 0n]).size).toBe(6);
    dir = tempDir();
    sock = path.join(dir, 'helper.sock');
    helper = await startHelper(['-k', sock, ...hostArgs(host)]);
    bystander = await LegacyClient.connect(sock);
    sleeper = spawn('sleep', ['60'], { stdio: 'ignore' });
  });

  afterAll(async () => {
    bystander?.close();
    sleeper?.kill('SIGKILL');
    await helper?.stop();
    host?.cleanup();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  /** The bystander, connected all along, still gets correct answers. */
  async function bystanderFine(): Promise<void> {
    expect(await bystander.request(0x611, 2, process.pid)).toBe(E1);
  }

  test("QEMU's start-up and sampling requests get the MSR file values", async () => {
    const c = await LegacyClient.connect(sock);
    expect(await c.request(0x606, 0, process.pid)).toBe(UNIT);
    expect(await c.request(0x610, 0, process.pid)).toBe(LIMIT);
    expect(await c.request(0x614, 0, process.pid)).toBe(INFO);
    // then 0x611 for one cpu per package, with a tid of one of our threads
    const tids = fs.readdirSync('/proc/self/task').map(Number);
    expect(await c.request(0x611, 0, tids[tids.length - 1]!)).toBe(E0);
    expect(await c.request(0x611, 2, process.pid)).toBe(E1);
    // the value changes between reads: no caching in the helper
    const saved = fs.readFileSync(host.msrPath(1));
    host.writeMsr(1, 0x611, 0x7777n);
    expect(await c.request(0x611, 1, process.pid)).toBe(0x7777n);
    fs.writeFileSync(host.msrPath(1), saved);
    c.close();
  });

  test('a tid of another process, tid 0 or a huge tid gets 0 and the connection stays', async () => {
    const c = await LegacyClient.connect(sock);
    expect(await c.request(0x611, 0, sleeper.pid!)).toBe(0n);
    expect(await c.request(0x606, 0, 0)).toBe(0n);
    expect(await c.request(0x606, 0, 0xffffffff)).toBe(0n);
    expect(await c.request(0x606, 0, process.pid)).toBe(UNIT);
    c.close();
    await bystanderFine();
  });

  test('a disallowed MSR closes the connection without a reply, after the replies before it', async () => {
    const c = await LegacyClient.connect(sock);
    c.send(Buffer.concat([req(0x606, 0, process.pid), req(0x10, 0, process.pid), req(0x611, 0, process.pid)]));
    expect((await c.readBytes(8)).readBigUInt64LE(0)).toBe(UNIT);
    await c.whenClosed();
    await expect(c.readBytes(8)).rejects.toThrow(/closed/);
    await bystanderFine();
  });

  test('offline and nonexistent cpus get 0 without the helper opening anything for them', async () => {
    const c = await LegacyClient.connect(sock);
    expect(await c.request(0x611, 3, process.pid)).toBe(0n);
    expect(await c.request(0x611, 99, process.pid)).toBe(0n);
    expect(await c.request(0x611, 0xffffffff, process.pid)).toBe(0n);
    const open = fs.readdirSync(`/proc/${helper.proc.pid}/fd`).map((fd) => {
      try {
        return fs.readlinkSync(`/proc/${helper.proc.pid}/fd/${fd}`);
      } catch {
        return '';
      }
    });
    expect(open).toContain(host.msrPath(0));
    expect(open).toContain(host.msrPath(2));
    expect(open).not.toContain(host.msrPath(3));
    c.close();
  });

  test('split requests (byte by byte) and pipelined requests are answered in order', async () => {
    const c = await LegacyClient.connect(sock);
    const one = req(0x614, 1, process.pid);
    for (const byte of one) {
      c.send(Buffer.from([byte]));
      await new Promise((r) => setTimeout(r, 2));
    }
    expect((await c.readBytes(8)).readBigUInt64LE(0)).toBe(INFO);

    const msrs = [0x606, 0x610, 0x611, 0x614];
    const expected = [UNIT, LIMIT, E0, INFO];
    const n = 400;
    const all = Buffer.concat(Array.from({ length: n }, (_, i) => req(msrs[i % 4]!, 0, process.pid)));
    // uneven cuts that straddle request boundaries
    for (let o = 0; o < all.length; o += 7 * 11) c.send(all.subarray(o, o + 7 * 11));
    const replies = await c.readBytes(n * 8);
    for (let i = 0; i < n; i++) expect(replies.readBigUInt64LE(i * 8)).toBe(expected[i % 4]);
    c.close();
  });

  test('a client that pipelines without reading gets every reply in order once it reads, and others are served meanwhile', async () => {
    const c = await LegacyClient.connect(sock);
    c.socket.pause(); // reads nothing: the kernel buffers fill, replies wait in the helper, it stops reading this client
    const msrs = [0x606, 0x610, 0x611, 0x614];
    const expected = [UNIT, LIMIT, E0, INFO];
    const n = 100_000; // 800 KB of replies, many times a Unix socket's buffers
    const all = Buffer.concat(Array.from({ length: n }, (_, i) => req(msrs[i % 4]!, 0, process.pid)));
    for (let o = 0; o < all.length; o += 4096 * 12) c.send(all.subarray(o, o + 4096 * 12));
    await new Promise((r) => setTimeout(r, 300));
    await bystanderFine();
    c.socket.resume();
    const replies = await c.readBytes(n * 8);
    for (let i = 0; i < n; i++)
      if (replies.readBigUInt64LE(i * 8) !== expected[i % 4]) expect.fail(`reply ${i} is ${replies.readBigUInt64LE(i * 8)}`);
    expect(c.closed).toBe(false);
    c.close();
  });

  test('a legacy connection holds one fd in the helper once served (the accepted socket is closed after the takeover), and its close frees it', async () => {
    // Its sockets only: discovery opens and closes fds for whatever QEMU-like processes other tests run meanwhile.
    const fds = () =>
      fs.readdirSync(`/proc/${helper.proc.pid}/fd`).filter((fd) => {
        try {
          return fs.readlinkSync(`/proc/${helper.proc.pid}/fd/${fd}`).startsWith('socket:');
        } catch {
          return false;
        }
      }).length;
    // Counted once the earlier tests' connections are gone: the same count over half a second.
    const before = await steady(fds, 'the socket count to settle before the connections');
    const clients = await Promise.all(Array.from({ length: 20 }, () => LegacyClient.connect(sock)));
    for (const c of clients) expect(await c.request(0x611, 0, process.pid)).toBe(E0);
    // The takeover of each accepted socket happens after its first reply: waited for, not read once.
    await waitFor(() => fds() - before === 20, `the helper to hold 20 sockets more than ${before}`, undefined, 30_000);
    expect(await steady(fds, 'the socket count to settle with the 20 connections')).toBe(before + 20);
    for (const c of clients) c.close();
    await waitFor(() => fds() === before, 'the helper to close the 20 connections', undefined, 30_000);
  });

  test('a failed MSR read replies 0; the cpu is fine again once readable', async () => {
    const c = await LegacyClient.connect(sock);
    const saved = fs.readFileSync(host.msrPath(1));
    fs.truncateSync(host.msrPath(1), 0); // pread now returns 0 bytes: a short read
    expect(await c.request(0x611, 1, process.pid)).toBe(0n);
    fs.writeFileSync(host.msrPath(1), saved);
    expect(await c.request(0x611, 1, process.pid)).toBe(E0);
    c.close();
  });

  test('garbage, half requests and vanishing clients never affect other clients', async () => {
    const garbage = await LegacyClient.connect(sock);
    garbage.send(Buffer.from('GET / HTTP/1.1\r\nHost: x\r\n\r\n'));
    await garbage.whenClosed();

    for (let i = 0; i < 20; i++) {
      const s = net.connect({ path: sock });
      s.on('error', () => {});
      await new Promise((r) => s.once('connect', r));
      s.write(req(0x611, 0, process.pid).subarray(0, 5)); // vanish mid-request
      s.destroy();
      const t = net.connect({ path: sock });
      t.on('error', () => {});
      await new Promise((r) => t.once('connect', r));
      t.end(req(0x611, 0, process.pid)); // request, then gone before the reply
      t.destroy();
    }
    const quiet = await LegacyClient.connect(sock); // connects and never sends
    await bystanderFine();
    const v2ish = await LegacyClient.connect(sock);
    // the magic hands the connection to the v2 service: an unknown frame type (0) is answered with
    // ERROR (type 0xFF, code 1 malformed) and a close, not with a legacy reply
    v2ish.send(Buffer.from('VMS2\0\0\0\0\0\0\0\0'));
    const head = await v2ish.readBytes(12);
    expect(head.readUInt16LE(0)).toBe(0xff);
    expect(head.readUInt32LE(8)).toBe(1);
    await v2ish.whenClosed();
    quiet.close();
    await bystanderFine();
    expect(helper.proc.exitCode).toBeNull();
  });

  test('a thousand clients at once each get their answer', async () => {
    const n = 1000;
    const clients = await Promise.all(Array.from({ length: n }, () => LegacyClient.connect(sock)));
    try {
      const values = await Promise.all(clients.map((c, i) => c.request(0x611, i % 2 === 0 ? 0 : 2, process.pid)));
      values.forEach((v, i) => expect(v).toBe(i % 2 === 0 ? E0 : E1));
    } finally {
      for (const c of clients) c.close();
    }
    await bystanderFine();
  });
});

describe('legacy protocol on an AMD host', () => {
  test('0x606/0x611 come from the AMD registers, 0x610/0x614 are synthesised and never 0', async () => {
    const host = new FakeHost({ packages: [0, 1] });
    const dir = tempDir();
    const sock = path.join(dir, 'amd.sock');
    const amdUnit = 0xa1003n; // power unit 1/8 W, energy unit 2^-16 J
    // 0xC001029B overlaps the unit's top bytes in a file: write energy first, unit last, and
    // expect what the file holds at each offset.
    host.writeMsr(0, 0xc001029b, 0x1111_0000_0000_0000n);
    host.writeMsr(1, 0xc001029b, 0x2222_0000_0000_0000n);
    host.writePackageMsr(0, 0xc0010299, amdUnit);
    host.writePackageMsr(1, 0xc0010299, amdUnit);
    const energy0 = at(host.msrPath(0), 0xc001029b);
    const energy1 = at(host.msrPath(1), 0xc001029b);
    expect(energy0).not.toBe(energy1);
    // Intel numbers hold decoys: an AMD host must never read them
    for (const cpu of [0, 1]) for (const msr of [0x606, 0x610, 0x611, 0x614]) host.writeMsr(cpu, msr, 0xbadn);
    let helper: DaemonChild | undefined;
    try {
      helper = await startHelper(['-k', sock, ...hostArgs(host, 'amd'), '--amd-tdp', '95.5']);
      const c = await LegacyClient.connect(sock);
      expect(await c.request(0x606, 0, process.pid)).toBe(amdUnit);
      const limit = await c.request(0x610, 0, process.pid);
      expect(limit).toBe(synthValue('power-limit', amdUnit, { powerLimitWatts: 120, tdpWatts: 95.5 }));
      expect(limit & 0x7fffn).toBe(960n); // 120 W in 1/8 W
      expect(await c.request(0x614, 0, process.pid)).toBe(synthValue('power-info', amdUnit, { powerLimitWatts: 120, tdpWatts: 95.5 }));
      expect(await c.request(0x614, 0, process.pid)).toBe(764n);
      expect(await c.request(0x611, 0, process.pid)).toBe(energy0);
      expect(await c.request(0x611, 1, process.pid)).toBe(energy1);
      // a refused tid still touches nothing and gives 0, also for synthesised registers
      expect(await c.request(0x610, 0, 0)).toBe(0n);
      c.close();
    } finally {
      await helper?.stop();
      host.cleanup();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
