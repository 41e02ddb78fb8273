/**
 * The memory settle after a burst of closed connections (docs/daemon.md "Memory settling") waits for a quiet second:
 * a full GC in the middle of a load stalls every client of it. A real daemon on a fake host, loaded by pipelined
 * legacy requests or by new connections.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { FakeHost } from '../support/fake-host.js';
import { hostArgs, LegacyClient, req, startHelper, tempDir, waitFor, type DaemonChild } from './support/daemon-process.js';

const SETTLED = 'memory given back after a burst of closed connections';
const cleanups: (() => void | Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function helper(): Promise<{ child: DaemonChild; sock: string }> {
  const host = new FakeHost();
  host.writePackageMsr(0, 0x606, 0xa1003n);
  const dir = tempDir('vmsr-settle-');
  const sock = path.join(dir, 'h.sock');
  const child = await startHelper(['-k', sock, ...hostArgs(host)]);
  cleanups.push(
    () => {
      host.cleanup();
      fs.rmSync(dir, { recursive: true, force: true });
    },
    () => child.stop('SIGKILL'),
  );
  return { child, sock };
}

/** 300 connections, each answered once, then all closed: past the 256 closes that start a settle. */
async function burst(sock: string): Promise<void> {
  const clients: LegacyClient[] = [];
  for (let i = 0; i < 300; i++) clients.push(await LegacyClient.connect(sock));
  await Promise.all(clients.map((c) => c.request(0x606, 0, process.pid)));
  for (const c of clients) c.close();
}

/** Requests until `until`: 200 pipelined at a time on 2 connections, or one per new connection every 50 ms. Returns their count. */
async function load(sock: string, kind: 'pipelined' | 'connections', until: number): Promise<number> {
  let answered = 0;
  if (kind === 'connections') {
    while (Date.now() < until) {
      const c = await LegacyClient.connect(sock);
      await c.request(0x606, 0, process.pid);
      c.close();
      answered++;
      await new Promise((r) => setTimeout(r, 50));
    }
    return answered;
  }
  const batch = Buffer.concat(Array.from({ length: 200 }, () => req(0x606, 0, process.pid)));
  const one = async () => {
    const c = await LegacyClient.connect(sock);
    while (Date.now() < until) {
      c.send(batch);
      await c.readBytes(8 * 200);
      answered += 200;
    }
    c.close();
  };
  await Promise.all([one(), one()]);
  return answered;
}

/** The log times (ms) of the settle's lines. */
function settles(child: DaemonChild): number[] {
  return child
    .stderr()
    .split('\n')
    .filter((l) => l.includes(SETTLED))
    .map((l) => Date.parse((JSON.parse(l) as { time: string }).time));
}

const settledAt = (child: DaemonChild): number | null => settles(child)[0] ?? null;

describe('memory settle', () => {
  test.each([
    { kind: 'pipelined' as const, seconds: 2.5 },
    { kind: 'pipelined' as const, seconds: 4 },
    { kind: 'connections' as const, seconds: 3 },
  ])(
    'the settle after a burst waits until a $kind load of $seconds s ends',
    async ({ kind, seconds }) => {
      const { child, sock } = await helper();
      await burst(sock);
      const answered = await load(sock, kind, Date.now() + seconds * 1000);
      const ended = Date.now();
      console.log(`${kind}: ${answered} requests answered in ${seconds} s`);
      if (kind === 'pipelined') expect(answered / seconds).toBeGreaterThan(2000); // the load is one, not a quiet second
      await waitFor(() => settledAt(child) !== null, 'the settle after the load', child, 30_000);
      expect(settledAt(child)).toBeGreaterThan(ended);
    },
    90_000,
  );

  test.each([{ pause: 1.5 }, { pause: 1.3 }])(
    'the settles of bursts of 1.5 s land in the $pause s pauses between them',
    async ({ pause }) => {
      const { child, sock } = await helper();
      const loads: [number, number][] = [];
      for (let i = 0; i < 6; i++) {
        const start = Date.now();
        await burst(sock);
        await load(sock, 'pipelined', Date.now() + 1500);
        loads.push([start, Date.now()]);
        await new Promise((r) => setTimeout(r, pause * 1000));
      }
      const times = settles(child);
      console.log(
        `settles at ${times.map((t) => t - loads[0]![0]).join(', ')} ms; loads ${loads.map(([a, b]) => `${a - loads[0]![0]}-${b - loads[0]![0]}`).join(', ')}`,
      );
      expect(times.length, 'settles in 6 rounds of bursts').toBeGreaterThan(0);
      for (const t of times)
        expect(
          loads.filter(([a, b]) => t > a && t < b),
          `the load around the settle at ${t}`,
        ).toEqual([]);
    },
    90_000,
  );

  test('the settle goes ahead under a load that never quiets, after at most 10 s', async () => {
    const { child, sock } = await helper();
    await burst(sock);
    const start = Date.now();
    const until = start + 16_000;
    let seenDuring: number | null = null;
    const watch = (async () => {
      while (Date.now() < until && seenDuring === null) {
        seenDuring = settledAt(child);
        await new Promise((r) => setTimeout(r, 100));
      }
    })();
    await Promise.all([load(sock, 'pipelined', until), watch]);
    expect(seenDuring, 'the settle during 16 s of load').not.toBeNull();
    expect(seenDuring! - start).toBeGreaterThan(9_000);
  }, 90_000);
});
