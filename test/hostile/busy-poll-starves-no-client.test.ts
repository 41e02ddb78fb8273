/**
 * Busy polling (helper/server/busy-poll.ts) against the real daemon: users of the socket asking again within microseconds of
 * each reply, in tight loops, make the helper poll for their next request. A QEMU-like client asking every few ms beside
 * them is answered all the same, and sampling goes on: the poll ends at any other event of the loop, reads a connection at
 * once only while it alone is ready, and for 1 ms a turn at most. (A poll on the hot connection alone, tried first, let it
 * be served turn after turn while the others waited.)
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import { describe, expect, test } from 'vitest';
import { V2Client } from '../../src/client/v2-client.js';
import { LegacyLatencyProbe, percentile } from '../support/legacy-latency.js';
import { NOBODY, notRoot, onCleanup, startDaemonOpenToAll } from './support.js';

/** One connection asking for 0x606 again as soon as each reply comes, for argv[2] s; prints the replies it got. */
const TIGHT_LOOP = String.raw`
import os, socket, struct, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
req = struct.pack('<III', 0x606, 0, os.getpid())
end, n = time.monotonic() + float(sys.argv[2]), 0
while time.monotonic() < end:
    s.sendall(req)
    got = b''
    while len(got) < 8:
        c = s.recv(8 - len(got))
        if not c:
            sys.exit('closed by the helper')
        got += c
    n += 1
print(n)
`;

/** Long enough that a client waiting for the tight loops to end would wait seconds; the deadline below is a fifth of it. */
const ATTACK_S = 5;
/** Far above what a reply takes beside the tight loops (about a millisecond here, tens on a busy machine). */
const REPLY_DEADLINE_MS = 1000;

function tightLoop(sock: string): Promise<number> {
  const child = spawn('python3', ['-c', TIGHT_LOOP, sock, String(ATTACK_S)], { uid: NOBODY, gid: NOBODY });
  onCleanup(() => void child.kill('SIGKILL'));
  let out = '';
  let err = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (err += d.toString()));
  return new Promise((resolve, reject) =>
    child.on('exit', (code) => (code === 0 ? resolve(Number(out.trim())) : reject(new Error(`tight loop exited ${code}: ${err}`)))),
  );
}

const contextSwitches = (pid: number) =>
  Number(/^voluntary_ctxt_switches:\s+(\d+)/m.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))![1]);

describe('busy polling beside other clients', () => {
  test.for([
    { loops: 1, everyMs: 10 },
    { loops: 2, everyMs: 2 },
    { loops: 3, everyMs: 10 },
  ])(
    'a QEMU-like client asking every $everyMs ms is answered within 1 s each time while uid nobody runs $loops tight loops of requests',
    { timeout: 60_000 },
    async ({ loops, everyMs }, ctx) => {
      const why = notRoot();
      if (why) return ctx.skip(why);
      const { daemon, sock } = await startDaemonOpenToAll();
      const probe = await LegacyLatencyProbe.start(sock, everyMs);
      onCleanup(() => void probe.stop());
      const observer = await V2Client.connect(sock);
      onCleanup(() => observer.close());
      let samples = 0;
      await observer.subscribeHost(() => samples++);
      const switches = contextSwitches(daemon.proc.pid!);
      const replies = await Promise.all(Array.from({ length: loops }, () => tightLoop(sock)));
      const sampled = samples;
      const waits = [...probe.stop(), probe.pendingMs()];
      const total = replies.reduce((a, b) => a + b, 0);
      console.log(
        `${loops} tight loops: ${replies.join(', ')} replies in ${ATTACK_S} s (helper: ${((contextSwitches(daemon.proc.pid!) - switches) / total).toFixed(2)} sleeps a request); ` +
          `${sampled} host samples; the client every ${everyMs} ms: ${waits.length} replies, p50 ${percentile(waits, 50).toFixed(2)} ms, p99 ${percentile(waits, 99).toFixed(2)} ms, max ${Math.max(...waits).toFixed(2)} ms`,
      );
      // The loops ran as loops (thousands of round trips), and the client beside them was read as its requests came.
      for (const n of replies) expect(n, 'round trips of a tight loop').toBeGreaterThan(1000);
      expect(probe.error).toBeNull();
      // Sampling went on (one a second by default): the loop's timers ran between the polls.
      expect(sampled, `host samples in the ${ATTACK_S} s of tight loops`).toBeGreaterThanOrEqual(ATTACK_S - 2);
      expect(waits.length, `the client's replies over ${ATTACK_S} s`).toBeGreaterThan(
        (ATTACK_S * 1000) / (everyMs + REPLY_DEADLINE_MS) + 1,
      );
      expect(
        waits.filter((w) => !(w < REPLY_DEADLINE_MS)),
        `replies to the client later than ${REPLY_DEADLINE_MS} ms`,
      ).toEqual([]);
    },
  );
});
