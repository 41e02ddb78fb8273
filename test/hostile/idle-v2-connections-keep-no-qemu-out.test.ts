/**
 * Connection slots (--max-connections) held by another user with v2 connections already past their
 * magic: served connections are never closed to make room, so before the per-uid share a user
 * holding every slot this way kept QEMU out. The attacker is a real process of uid nobody against
 * the real daemon; QEMU is a legacy client of root.
 */
import { spawn } from 'node:child_process';
import { describe, expect, test } from 'vitest';
import { shareOf, UID_SHARE } from '../../src/budget/uid-share.js';
import { LegacyClient } from '../daemon/support/daemon-process.js';
import { PYTHON } from '../support/fake-qemu.js';
import { waitFor } from '../support/wait.js';
import { NOBODY, notRoot, onCleanup, sleep, startDaemonOpenToAll } from './support.js';

const MAX_CONNECTIONS = 40;
/** More than every slot. */
const HOARDED = MAX_CONNECTIONS + 20;

/** argv: socket, count. Opens `count` v2 connections (magic sent), keeps them; prints how many are still open every 200 ms. */
const HOARDER = `
import socket, sys, time, select
path, n = sys.argv[1], int(sys.argv[2])
conns = []
for i in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        s.sendall(b'VMS2')
        conns.append(s)
    except OSError:
        pass
while True:
    time.sleep(0.2)
    for s in list(conns):
        r, _, _ = select.select([s], [], [], 0)
        if r:
            try:
                if not s.recv(1):
                    conns.remove(s); s.close()
            except OSError:
                conns.remove(s); s.close()
    print('open', len(conns), flush=True)
`;

describe('connection slots and idle v2 connections', () => {
  test("a user holding more v2 connections than there are slots gets its share only, and QEMU's legacy connection is served", async (ctx) => {
    const why = notRoot();
    if (why) return ctx.skip(why);
    const { daemon, sock } = await startDaemonOpenToAll(['--max-connections', String(MAX_CONNECTIONS)]);
    const hoarder = spawn(PYTHON, ['-c', HOARDER, sock, String(HOARDED)], {
      uid: NOBODY,
      gid: NOBODY,
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    onCleanup(() => void hoarder.kill('SIGKILL'));
    let open = -1;
    hoarder.stdout.on('data', (d: Buffer) => {
      const m = /open (\d+)\s*$/.exec(d.toString());
      if (m) open = Number(m[1]);
    });
    await waitFor(() => open >= 0, 'the hoarder to report');
    // Its share: a quarter of the slots; the rest of its connections are closed at accept (on a busy
    // machine the daemon may take a while to accept the whole backlog: the deadline is far above it).
    const share = shareOf(MAX_CONNECTIONS, UID_SHARE);
    await waitFor(() => open === share, `the hoarder's connections past its share of ${share} closed`, undefined, 60_000);
    await sleep(1_000);
    expect(open).toBe(share);
    expect(daemon.stderr()).toContain('its share of --max-connections');
    // QEMU (root) connects and is answered while the hoarder keeps its connections.
    const c = await LegacyClient.connect(sock);
    onCleanup(() => c.close());
    expect(await c.request(0x606, 0, process.pid)).toBe(0xa1003n);
  }, 120_000);
});
