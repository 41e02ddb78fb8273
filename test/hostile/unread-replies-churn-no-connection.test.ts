/**
 * A client pipelining thousands of v2 requests (STATS_FD, LIST) without reading the replies was
 * answered until its backlog passed --max-backlog, then disconnected with thousands of small writes
 * queued (one Node error each at the close), and reconnected to do it again: under a flood of such
 * connections the serving process was 99 % busy (0.2 s idle in 16 s) and a new QEMU waited 0.4 to
 * 6.8 s for its first reply on a busy host (docs/security.md, "The socket's group locking QEMU
 * out"). Now the client waits for itself, as a legacy one does: past 64 KiB of replies unsent, its
 * requests are not read until it reads; nothing is lost and it is not disconnected for it.
 *
 * Against the real daemon dropped to -u nobody: the client connects, writes its requests, reads
 * nothing for 3 s, then reads: every reply comes, in order, on the same connection.
 */
import net from 'node:net';
import { describe, expect, test } from 'vitest';
import { V2_MAGIC } from '../../src/protocol/legacy.js';
import { encodeU32Frame, T } from '../../src/protocol/v2/codec.js';
import { helperMessages } from '../support/helper-messages.js';
import { notRoot, onCleanup, sleep, startDaemonOpenToAll } from './support.js';

/** Requests pipelined: 768 KiB of them, asking for about 1.5 MiB of replies (ERROR frames), far past --max-backlog's 256 KiB. */
const REQUESTS = 65_536;
/** What the client reads nothing for: the old daemon disconnected it within a second. */
const UNREAD_MS = 3000;
/** Every reply read by then: far above what is expected (about a second on a busy host). */
const READ_DEADLINE_MS = 60_000;

/** Request kinds a client can pipeline: a VM that is not there (refused, ERROR 3), the VM list (answered). */
const KINDS: readonly (readonly [string, Buffer, number])[] = [
  ['STATS_FD of a VM that is not there', encodeU32Frame(T.STATS_FD, 999_999), T.ERROR],
  ['LIST', encodeU32Frame(T.LIST, 0), T.VM_LIST],
];

describe('replies left unread', () => {
  for (const [kind, request, replyType] of KINDS) {
    test(
      `a v2 client pipelining ${REQUESTS} ${kind} requests without reading gets every reply once it reads, and is not disconnected`,
      async (ctx) => {
        const why = notRoot();
        if (why) return ctx.skip(why);
        const { daemon, sock } = await startDaemonOpenToAll();
        const client = net.connect({ path: sock });
        onCleanup(() => void client.destroy());
        client.on('error', () => {});
        await new Promise<void>((r, j) => client.once('connect', r).once('error', j));
        client.pause();
        let ended = false;
        client.on('end', () => (ended = true));
        client.write(Buffer.concat([V2_MAGIC, ...Array.from({ length: REQUESTS }, () => request)]));
        await sleep(UNREAD_MS);
        const chunks: Buffer[] = [];
        let bytes = Buffer.alloc(0);
        let frames = 0;
        client.on('data', (d: Buffer) => chunks.push(d));
        client.resume();
        for (const end = Date.now() + READ_DEADLINE_MS; frames < REQUESTS && !ended && Date.now() < end;) {
          await sleep(100);
          bytes = Buffer.concat([bytes, ...chunks.splice(0)]);
          frames = countFrames(bytes);
        }
        expect(ended, 'the helper closed the connection').toBe(false);
        expect(frames, `replies read within ${READ_DEADLINE_MS} ms`).toBe(REQUESTS);
        const types = new Set(helperMessages(bytes).map((m) => m.type));
        expect([...types]).toEqual([replyType]);
        expect(daemon.stderr()).not.toContain('does not read its socket');
        expect(daemon.proc.exitCode).toBeNull();
      },
      UNREAD_MS + READ_DEADLINE_MS + 30_000,
    );
  }
});

/** Whole v2 frames at the start of `buf` (8-byte header, its 32-bit length at offset 4). */
function countFrames(buf: Buffer): number {
  let n = 0;
  for (let at = 0; at + 8 <= buf.length && at + 8 + buf.readUInt32LE(at + 4) <= buf.length; at += 8 + buf.readUInt32LE(at + 4)) n++;
  return n;
}
