import fs from 'node:fs';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { afterEach, describe, expect, it } from 'vitest';
import { helperMessages } from '../support/helper-messages.js';
import { V2Client } from '../../src/client/v2-client.js';
import { V2Error, type HostUpdate, type Update } from '../../src/client/v2-replies.js';
import { E, MAX_PAYLOAD, T, encodeFrame, encodeRead, encodeRegister, encodeSubscribe } from '../../src/protocol/v2/codec.js';
import { isRoot } from '../support/env.js';
import {
  POWER_UNIT,
  RawClient,
  expectIdle,
  hostSamples,
  seenByNewClient,
  startChild,
  startHarness,
  threadsOf,
  until,
  untilAsync,
  type Harness,
} from './harness.js';

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function harness(o: Parameters<typeof startHarness>[0] = {}): Promise<Harness> {
  const h = await startHarness(o);
  cleanups.push(() => h.close());
  return h;
}

async function client(h: Harness): Promise<V2Client> {
  const c = await V2Client.connect(h.socketPath);
  cleanups.push(() => c.close());
  return c;
}

function child(kind: 'spin' | 'sleep') {
  const c = startChild(kind);
  cleanups.push(() => c.kill());
  return c;
}

const messages = helperMessages;

async function expectV2Error(p: Promise<unknown>, code: number): Promise<V2Error> {
  const e = await p.then(
    () => null,
    (err: unknown) => err,
  );
  expect(e).toBeInstanceOf(V2Error);
  expect((e as V2Error).code).toBe(code);
  return e as V2Error;
}

const self = () =>
  threadsOf(process.pid)
    .slice(0, 2)
    .map((tid, i) => ({ tid, vpkg: i }));

describe('v2 service on a real socket', () => {
  it('REGISTER own threads: vm_id, nvpkg, the guest power unit; zeros before the first interval', async () => {
    const h = await harness({ intervalMs: 5000 });
    const c = await client(h);
    const r = await c.register({ vcpus: self() });
    expect(r.nvpkg).toBe(2);
    expect(r.powerUnit).toBe(POWER_UNIT);
    const v = await c.read(r.vmId, 1);
    expect(v).toEqual({ vmId: r.vmId, vpkg: 1, counter: 0n, energyUj: 0n, tNs: 0n, ended: false });
    expect(await c.list()).toHaveLength(1);
  });

  it('SUBSCRIBE: immediate UPDATE, then one per sample; a spinning VM gains energy, values monotonic', async () => {
    const h = await harness({ intervalMs: 40 });
    const spin = child('spin');
    const c = await client(h);
    const r = await c.register({ pid: spin.pid, vcpus: [{ tid: spin.pid, vpkg: 0 }] });
    const updates: Update[] = [];
    const pump = setInterval(() => h.addEnergy(20000), 10); // ~1.2 J per 10 ms: the package is busy
    cleanups.push(() => clearInterval(pump));
    const first = await c.subscribe(r.vmId, (u) => updates.push(u));
    expect(first.vmId).toBe(r.vmId);
    expect(first.vpkgs).toHaveLength(1);
    await until(() => updates.length >= 8 && updates.at(-1)!.vpkgs[0]!.energyUj > 0n, 8000, 'updates with energy');
    for (let i = 1; i < updates.length; i++) {
      expect(updates[i]!.vpkgs[0]!.energyUj).toBeGreaterThanOrEqual(updates[i - 1]!.vpkgs[0]!.energyUj);
      expect(updates[i]!.tNs).toBeGreaterThanOrEqual(updates[i - 1]!.tNs);
      expect(updates[i]!.ended).toBe(false);
    }
    const last = updates.at(-1)!;
    // counter = floor(A / u_guest) and energy_uj = floor(A * 1e6): consistent with each other.
    const uj = Number(last.vpkgs[0]!.energyUj);
    const counterJ = Number(last.vpkgs[0]!.counter) * 2 ** -14;
    expect(Math.abs(counterJ * 1e6 - uj)).toBeLessThan(2 ** -14 * 1e6 + 1);
    const v = await c.read(r.vmId, 0);
    expect(v.energyUj).toBeGreaterThanOrEqual(last.vpkgs[0]!.energyUj);
  });

  it('UNREGISTER answers OK, then the vm_id is unknown (ERROR 3); READ of an unknown vpkg is ERROR 3', async () => {
    const h = await harness();
    const c = await client(h);
    const r = await c.register({ vcpus: self() });
    await expectV2Error(c.read(r.vmId, 2), E.NO_SUCH);
    await expectV2Error(c.read(r.vmId + 100, 0), E.NO_SUCH);
    await expectV2Error(
      c.subscribe(r.vmId + 100, () => {}),
      E.NO_SUCH,
    );
    await c.unregister(r.vmId);
    expect(await c.list()).toEqual([]);
    await expectV2Error(c.read(r.vmId, 0), E.NO_SUCH);
    await expectV2Error(c.unregister(r.vmId), E.NO_SUCH);
  });

  it('the client sends requests made in one tick in a single write, answered in order', async () => {
    const h = await harness({ intervalMs: 5000 });
    const c = await client(h);
    const r = await c.register({ vcpus: self() });
    // What reaches the socket: one write carrying all 3 frames (2 READs of 16 bytes, 1 UNREGISTER of 12).
    const sock = (c as unknown as { socket: { write: (...a: unknown[]) => boolean } }).socket;
    const writes: number[] = [];
    const write = sock.write;
    sock.write = function (this: unknown, chunk: unknown, ...a: unknown[]) {
      writes.push((chunk as Buffer).length);
      return write.apply(this, [chunk, ...a]);
    };
    const [v0, v1] = await Promise.all([c.read(r.vmId, 0), c.read(r.vmId, 1), c.unregister(r.vmId)]);
    expect(writes).toEqual([16 + 16 + 12]);
    expect([v0.vpkg, v1.vpkg]).toEqual([0, 1]);
    expect(await c.list()).toEqual([]);
  });

  it('HOST_UPDATE says VMs changed in the one sample after a VM came or went', async () => {
    const h = await harness({ intervalMs: 30 });
    const c = await client(h);
    const host: HostUpdate[] = [];
    expect((await c.subscribeHost((u) => host.push(u))).vmsChanged).toBe(false);
    await until(() => host.length >= 2, 3000, 'host updates');
    expect(host.some((u) => u.vmsChanged)).toBe(false);
    // The flag once, in the first sample after the change, then not in the two after it.
    const once = async <T>(change: () => Promise<T>): Promise<T> => {
      const n = host.length;
      const out = await change();
      const flagged = () => host.slice(n).findIndex((u) => u.vmsChanged);
      await until(() => flagged() >= 0 && host.length - n - flagged() >= 3, 3000, 'two updates after the change');
      expect(host.slice(n).filter((u) => u.vmsChanged)).toHaveLength(1);
      return out;
    };
    const r = await once(() => c.register({ vcpus: self() }));
    await once(() => c.unregister(r.vmId));
  });

  it("another connection's VM is not visible (ERROR 3)", async () => {
    const h = await harness();
    const a = await client(h);
    const b = await client(h);
    const r = await a.register({ vcpus: self() });
    await expectV2Error(b.read(r.vmId, 0), E.NO_SUCH);
    await expectV2Error(b.unregister(r.vmId), E.NO_SUCH);
    expect((await a.read(r.vmId, 0)).vmId).toBe(r.vmId);
  });

  it('closing a connection unregisters its VMs and the loop goes idle', async () => {
    const h = await harness({ intervalMs: 20 });
    const observer = await client(h);
    const samples = await hostSamples(observer);
    cleanups.push(() => samples.close());
    const c = await V2Client.connect(h.socketPath);
    await c.register({ vcpus: self() });
    await until(() => samples.now() >= 2, 3000, 'samples');
    await c.close();
    // Its VMs are released where its connection is dropped (V2Service.connectionClosed).
    await untilAsync(async () => (await observer.list()).length === 0, 3000, 'unregistered');
    await expectIdle(samples);
  });

  it('the loop does not sample without VMs', async () => {
    const h = await harness({ intervalMs: 10 });
    const c = await client(h);
    const samples = await hostSamples(c);
    cleanups.push(() => samples.close());
    await new Promise((r) => setTimeout(r, 100));
    expect(samples.now()).toBe(0);
    const r = await c.register({ vcpus: self() });
    await until(() => samples.now() >= 3, 3000, 'samples');
    await c.unregister(r.vmId);
    await expectIdle(samples);
  });

  it('a VM whose process ends freezes: one UPDATE with flag bit 0, then none; READ keeps its final values', async () => {
    const h = await harness({ intervalMs: 30 });
    const sleeper = child('sleep');
    const c = await client(h);
    const r = await c.register({ pid: sleeper.pid, vcpus: [{ tid: sleeper.pid, vpkg: 0 }] });
    const updates: Update[] = [];
    await c.subscribe(r.vmId, (u) => updates.push(u));
    await until(() => updates.length >= 3, 3000, 'updates');
    await sleeper.kill();
    await until(() => updates.some((u) => u.ended), 3000, 'ended update');
    const endedAt = updates.length;
    await new Promise((res) => setTimeout(res, 150));
    expect(updates.length).toBe(endedAt);
    expect(updates.filter((u) => u.ended)).toHaveLength(1);
    const final = updates.at(-1)!;
    const v = await c.read(r.vmId, 0);
    expect(v.ended).toBe(true);
    expect(v.energyUj).toBe(final.vpkgs[0]!.energyUj);
    expect(v.tNs).toBe(final.tNs);
    // The pid may be registered again once its VM ended... it no longer exists, so: process gone.
    await expectV2Error(c.register({ pid: sleeper.pid, vcpus: [{ tid: sleeper.pid, vpkg: 0 }] }), E.PROCESS_GONE);
    const samples = await hostSamples(c);
    cleanups.push(() => samples.close());
    await c.unregister(r.vmId);
    await expectIdle(samples);
  });

  it('refuses tids that are not threads of pid (ERROR 2) and a pid that does not exist (ERROR 6)', async () => {
    const h = await harness();
    const other = child('sleep');
    const c = await client(h);
    const e = await expectV2Error(c.register({ vcpus: [{ tid: other.pid, vpkg: 0 }] }), E.NOT_PERMITTED);
    expect(e.message).toMatch(/not a thread/);
    await expectV2Error(c.register({ pid: 0x3ffffff0, vcpus: [{ tid: 0x3ffffff0, vpkg: 0 }] }), E.PROCESS_GONE);
    expect(await c.list()).toEqual([]);
  });

  it('a second live registration of the same pid is refused with ERROR 4', async () => {
    const h = await harness();
    const a = await client(h);
    const b = await client(h);
    await a.register({ vcpus: self() });
    await expectV2Error(b.register({ pid: process.pid, vcpus: self() }), E.LIMIT);
  });

  it('limits: VMs per connection, total VMs, vCPUs per VM (ERROR 4); a pipelined flood changes nothing else', async () => {
    const h = await harness({ limits: { maxVmsPerConnection: 2, maxVms: 3, maxVcpus: 1 } });
    const kids = [child('sleep'), child('sleep'), child('sleep'), child('sleep')];
    const a = await client(h);
    const b = await client(h);
    await expectV2Error(a.register({ vcpus: self() }), E.LIMIT); // 2 vCPUs > 1
    await a.register({ pid: kids[0]!.pid, vcpus: [{ tid: kids[0]!.pid, vpkg: 0 }] });
    await a.register({ pid: kids[1]!.pid, vcpus: [{ tid: kids[1]!.pid, vpkg: 0 }] });
    await expectV2Error(a.register({ pid: kids[2]!.pid, vcpus: [{ tid: kids[2]!.pid, vpkg: 0 }] }), E.LIMIT);
    await b.register({ pid: kids[2]!.pid, vcpus: [{ tid: kids[2]!.pid, vpkg: 0 }] });
    await expectV2Error(b.register({ pid: kids[3]!.pid, vcpus: [{ tid: kids[3]!.pid, vpkg: 0 }] }), E.LIMIT);
    expect(await a.list()).toHaveLength(3);

    // 2000 pipelined REGISTERs in one write: every one answered in order, none accepted.
    const raw = await RawClient.connect(h.socketPath);
    cleanups.push(() => raw.destroy());
    const frame = encodeRegister({ pid: kids[3]!.pid, vcpus: [{ tid: kids[3]!.pid, vpkg: 0 }] });
    raw.write(Buffer.concat(Array.from({ length: 2000 }, () => frame)));
    const errLen = (await raw.waitBytes(16)).readUInt32LE(4) + 8;
    await raw.waitBytes(errLen * 2000, 5000);
    const ms = messages(raw.received);
    expect(ms).toHaveLength(2000);
    expect(ms.every((m) => m.type === T.ERROR && m.code === E.LIMIT)).toBe(true);
    expect(await a.list()).toHaveLength(3);
    expect((await a.read(1, 0)).vmId).toBe(1);
  });

  describe('malformed input', () => {
    const fatal: [string, Buffer][] = [
      ['unknown type', encodeFrame(0x42, 0, Buffer.alloc(4))],
      ['a helper type from a client', encodeFrame(T.VALUE, 0, Buffer.alloc(32))],
      [
        'length over 65536',
        (() => {
          const b = Buffer.alloc(8);
          b.writeUInt16LE(T.READ, 0);
          b.writeUInt32LE(MAX_PAYLOAD + 1, 4);
          return b;
        })(),
      ],
      ['READ of the wrong size', encodeFrame(T.READ, 0, Buffer.alloc(12))],
      ['SUBSCRIBE of the wrong size', encodeFrame(T.SUBSCRIBE, 0, Buffer.alloc(0))],
      [
        'REGISTER with a lying nvcpu',
        (() => {
          const b = encodeRegister({ pid: 0, vcpus: [{ tid: process.pid, vpkg: 0 }] });
          b.writeUInt32LE(2, 12);
          return b;
        })(),
      ],
    ];
    for (const [name, bytes] of fatal) {
      it(`${name}: ERROR 1, then the helper closes; other clients unaffected`, async () => {
        const h = await harness();
        const good = await client(h);
        const reg = await good.register({ vcpus: self() });
        const raw = await RawClient.connect(h.socketPath);
        cleanups.push(() => raw.destroy());
        raw.write(bytes);
        raw.write(encodeRead(reg.vmId, 0)); // after a fatal frame nothing more is answered
        await raw.closed;
        const ms = messages(raw.received);
        expect(ms).toHaveLength(1);
        expect(ms[0]).toMatchObject({ type: T.ERROR, code: E.MALFORMED });
        expect((await good.read(reg.vmId, 0)).vmId).toBe(reg.vmId);
      });
    }

    it('well-framed bad content gets ERROR 1 and the connection stays usable', async () => {
      const h = await harness();
      const raw = await RawClient.connect(h.socketPath);
      cleanups.push(() => raw.destroy());
      const bad = [
        encodeRegister({ pid: 0, vcpus: [] }),
        encodeRegister({ pid: 0, vcpus: [{ tid: process.pid, vpkg: 256 }] }),
        encodeRegister({
          pid: 0,
          vcpus: [
            { tid: process.pid, vpkg: 0 },
            { tid: process.pid, vpkg: 1 },
          ],
        }),
        encodeFrame(T.READ, 4, Buffer.alloc(8)),
      ];
      // Split at odd places to exercise the service's reassembly too.
      const all = Buffer.concat([...bad, encodeRegister({ pid: 0, vcpus: [{ tid: process.pid, vpkg: 0 }] })]);
      for (let i = 0; i < all.length; i += 7) raw.write(all.subarray(i, i + 7));
      await until(
        () => {
          try {
            return messages(raw.received).length === 5;
          } catch {
            return false;
          }
        },
        3000,
        'five replies',
      );
      const ms = messages(raw.received);
      expect(ms.slice(0, 4).map((m) => m.type === T.ERROR && m.code)).toEqual([1, 1, 1, 1]);
      expect(ms[4]!.type).toBe(T.REGISTERED);
    });

    it('a connection without the magic never reaches the v2 service', async () => {
      const h = await harness();
      const raw = await RawClient.connect(h.socketPath, false);
      raw.write(encodeRead(1, 0));
      await raw.closed;
      expect(await seenByNewClient(h.socketPath)).toEqual({ vms: 0, connections: 0 });
    });
  });

  it('a reader that does not read is disconnected past its backlog; the helper and others carry on', async () => {
    const h = await harness({ intervalMs: 20, limits: { maxBacklogBytes: 16 * 1024 } });
    const good = await client(h);
    const reg = await good.register({ vcpus: self() });
    const goodUpdates: Update[] = [];
    await good.subscribe(reg.vmId, (u) => goodUpdates.push(u));

    const slow = await RawClient.connect(h.socketPath);
    cleanups.push(() => slow.destroy());
    slow.socket.pause(); // never reads: kernel buffers fill, then the helper's queue
    const sleeper = child('sleep');
    slow.write(encodeRegister({ pid: sleeper.pid, vcpus: [{ tid: sleeper.pid, vpkg: 0 }] }));
    slow.write(encodeSubscribe(2));
    // 40000 READs = 640 KB of requests asking for 1.6 MB of replies.
    const flood = Buffer.concat(Array.from({ length: 40000 }, () => encodeRead(2, 0)));
    slow.write(flood);
    await slow.closed;
    // Its VM is released where its connection is dropped (V2Service.connectionClosed).
    await untilAsync(async () => (await good.list()).length === 1, 3000, 'slow client dropped');
    const n = goodUpdates.length;
    await until(() => goodUpdates.length >= n + 3, 3000, 'good client still updated');
    expect((await good.read(reg.vmId, 0)).vmId).toBe(reg.vmId);
  });

  it('energy source failure: READ gets ERROR 5, subscribers one ERROR 5 notice, updates resume on recovery', async () => {
    const h = await harness({ intervalMs: 20 });
    const c = await client(h);
    const r = await c.register({ vcpus: self() });
    const updates: Update[] = [];
    const notices: V2Error[] = [];
    await c.subscribe(
      r.vmId,
      (u) => updates.push(u),
      (e) => notices.push(e),
    );
    await until(() => updates.length >= 3, 3000, 'updates');
    // A truncated MSR file gives a short pread: the energy read fails.
    const saved = fs.readFileSync(h.fake.msrPath(0));
    fs.truncateSync(h.fake.msrPath(0), 0);
    await until(() => notices.length >= 1, 3000, 'ERROR 5 notice');
    await expectV2Error(c.read(r.vmId, 0), E.ENERGY_SOURCE);
    await new Promise((res) => setTimeout(res, 100));
    expect(notices).toHaveLength(1);
    expect(notices[0]!.code).toBe(E.ENERGY_SOURCE);
    const during = updates.length;
    fs.writeFileSync(h.fake.msrPath(0), saved);
    await until(() => updates.length >= during + 2, 3000, 'updates after recovery');
    expect((await c.read(r.vmId, 0)).ended).toBe(false);
  });

  it('a non-root peer may register its own process but not a root-owned one (ERROR 2)', async (ctx) => {
    if (!isRoot()) return ctx.skip('needs root to start a child as uid 65534');
    const h = await harness();
    // The child speaks raw v2 (no imports: it runs as nobody, from a world-readable script).
    const script = path.join(h.dir, 'nobody-client.cjs');
    fs.writeFileSync(
      script,
      `const net = require('net');
const [sock, foreignPid] = process.argv.slice(2);
function reg(pid, tid) { const b = Buffer.alloc(24); b.writeUInt16LE(1, 0); b.writeUInt32LE(16, 4);
  b.writeUInt32LE(pid, 8); b.writeUInt32LE(1, 12); b.writeUInt32LE(tid, 16); b.writeUInt32LE(0, 20); return b; }
const s = net.createConnection(sock, () => {
  s.write(Buffer.concat([Buffer.from('VMS2'), reg(Number(foreignPid), Number(foreignPid)), reg(0, process.pid)]));
});
let got = Buffer.alloc(0);
// Stop after two whole frames, however the bytes are chunked.
function frames(b) { let n = 0, off = 0; while (b.length - off >= 8 && b.length - off >= 8 + b.readUInt32LE(off + 4)) { off += 8 + b.readUInt32LE(off + 4); n++; } return n; }
s.on('data', (d) => { got = Buffer.concat([got, d]); if (frames(got) >= 2) { process.stdout.write(got.toString('hex')); s.destroy(); } });
s.on('error', (e) => { process.stderr.write(String(e)); process.exit(2); });
`,
    );
    fs.chmodSync(script, 0o644);
    const out = await new Promise<string>((resolve, reject) => {
      const p = spawn(process.execPath, [script, h.socketPath, String(process.pid)], {
        uid: 65534,
        gid: 65534,
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let o = '';
      let err = '';
      p.stdout.on('data', (d) => (o += d));
      p.stderr.on('data', (d) => (err += d));
      const t = setTimeout(() => p.kill('SIGKILL'), 5000);
      p.on('exit', (code) => {
        clearTimeout(t);
        code === 0 ? resolve(o) : reject(new Error(`child exited ${code}: ${err}`));
      });
    });
    const ms = messages(Buffer.from(out, 'hex'));
    expect(ms[0]).toMatchObject({ type: T.ERROR, code: E.NOT_PERMITTED, requestType: T.REGISTER });
    expect(ms[1]?.type).toBe(T.REGISTERED);
  });
});
