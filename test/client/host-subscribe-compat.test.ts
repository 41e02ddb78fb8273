/**
 * The client library against a helper from before per-package unattributed energy: such a helper
 * answers HOST_SUBSCRIBE with flags 0x1 by ERROR 1 ("flags must be 0, got 0x1") and keeps the
 * connection, then serves the original 16-byte package entries to a plain HOST_SUBSCRIBE. The peer
 * here speaks exactly those bytes (the shared encoders, whose bytes test/protocol/byte-vectors pins)
 * on a real Unix socket; the current daemon's side is in test/daemon/observers.daemon.test.ts. The same
 * for the other RAPL domains: a helper from before them refuses the SUBSCRIBE / OBSERVE flag and the
 * HOST_SUBSCRIBE bit asking for them (the daemon's side: test/daemon/domains.daemon.test.ts).
 */
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { V2Client } from '../../src/client/v2-client.js';
import { type HostUpdate } from '../../src/client/v2-replies.js';
import { V2_MAGIC } from '../../src/protocol/legacy.js';
import { CLIENT_TYPES, E, T, encodeError, encodeHostUpdate, encodeUpdate } from '../../src/protocol/v2/codec.js';
import { FrameDecoder } from '../../src/protocol/v2/frame-decoder.js';
import { hostStats } from '../support/helper-messages.js';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const STATS = hostStats({ samples: 3n, connections: 1 });

/**
 * A helper of the previous protocol revision: refuses any HOST_SUBSCRIBE flag, sends the original layout;
 * refuses any SUBSCRIBE or OBSERVE flag (as every helper before the other RAPL domains), and answers one
 * without flags with an UPDATE of the original layout.
 */
async function previousHelper(sock: string, seen: { type?: number; flags: number }[]): Promise<void> {
  const srv = net.createServer((s) => {
    const d = new FrameDecoder(CLIENT_TYPES);
    let magic = true;
    s.on('data', (b: Buffer) => {
      if (magic) {
        expect(b.subarray(0, 4).equals(V2_MAGIC)).toBe(true);
        b = b.subarray(4);
        magic = false;
      }
      for (const f of d.push(b)) {
        if (f.ok && (f.value.type === T.SUBSCRIBE || f.value.type === T.OBSERVE)) {
          const { type, flags } = f.value;
          seen.push({ type, flags });
          if (flags !== 0) s.write(encodeError(E.MALFORMED, type, `flags must be 0, got 0x${flags.toString(16)}`));
          else s.write(encodeUpdate(f.value.payload.readUInt32LE(0), 9n, [{ counter: 1n, energyUj: 61n }], false));
          continue;
        }
        if (!f.ok || f.value.type !== T.HOST_SUBSCRIBE) throw new Error('unexpected request');
        seen.push({ flags: f.value.flags });
        if (f.value.flags !== 0)
          s.write(encodeError(E.MALFORMED, T.HOST_SUBSCRIBE, `flags must be 0, got 0x${f.value.flags.toString(16)}`));
        else
          s.write(
            encodeHostUpdate({
              tNs: 9n,
              packages: [{ pkg: 0, energyUj: 5_000n, unattributedUj: null }],
              unattributedUj: 1_000n,
              vmsChanged: false,
              stats: STATS,
            }),
          );
      }
    });
  });
  await new Promise<void>((r) => srv.listen(sock, r));
  cleanups.push(() => new Promise((r) => srv.close(r)));
}

describe('host subscription compatibility', () => {
  test('subscribeHost on a helper that predates per-package energy subscribes without it: packages carry null, the host-wide value stays', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-compat-'));
    cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
    const sock = path.join(dir, 'old.sock');
    const seen: { flags: number }[] = [];
    await previousHelper(sock, seen);
    const c = await V2Client.connect(sock);
    cleanups.push(() => c.close());
    const updates: HostUpdate[] = [];
    const first = await c.subscribeHost((u) => updates.push(u));
    expect(seen).toEqual([{ flags: 1 }, { flags: 0 }]);
    expect(first.packages).toEqual([{ pkg: 0, energyUj: 5_000n, unattributedUj: null }]);
    expect(first.unattributedUj).toBe(1_000n);
    // The refused first attempt did not end the subscription: the update went to the callback too.
    expect(updates).toHaveLength(1);
  });

  test('asking a helper that predates the other RAPL domains for them falls back, flag by flag, to what it serves: no domains, nothing lost', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-compat-'));
    cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
    const sock = path.join(dir, 'old.sock');
    const seen: { type?: number; flags: number }[] = [];
    await previousHelper(sock, seen);
    const c = await V2Client.connect(sock);
    cleanups.push(() => c.close());
    const host = await c.subscribeHost(() => {}, undefined, { domains: true });
    expect(seen.splice(0)).toEqual([{ flags: 3 }, { flags: 1 }, { flags: 0 }]);
    expect(host.domains).toBeUndefined();
    expect(host.packages).toEqual([{ pkg: 0, energyUj: 5_000n, unattributedUj: null }]);
    const got: unknown[] = [];
    const sub = await c.subscribe(4, (u) => got.push(u), undefined, { domains: true });
    const obs = await c.observe(5, (u) => got.push(u), undefined, { domains: true });
    expect(seen).toEqual([
      { type: T.SUBSCRIBE, flags: 1 },
      { type: T.SUBSCRIBE, flags: 0 },
      { type: T.OBSERVE, flags: 1 },
      { type: T.OBSERVE, flags: 0 },
    ]);
    expect(sub).toEqual({ vmId: 4, tNs: 9n, vpkgs: [{ counter: 1n, energyUj: 61n }], ended: false });
    expect(obs).toEqual({ hostVmId: 5, tNs: 9n, vpkgs: [{ counter: 1n, energyUj: 61n }], ended: false });
    expect(got).toHaveLength(2);
  });
});
