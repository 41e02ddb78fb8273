/**
 * The keeper under attack (docs/daemon.md "Crashes"): uid nobody floods the socket of a daemon run by
 * `vmsr-helper --keeper` with thousands of connections holding half a v2 frame, reopening each when
 * closed, and signals the keeper. The keeper reads nothing from any client and holds only the
 * connections of preferred peers (root, the socket's group: QEMU), so the flood costs it not one fd;
 * it holds no capability; a user other than -u's cannot signal it; and when the serving process is killed in the
 * middle of the flood, the keeper starts the next one, which answers the QEMU-like client's request.
 */
import fs from 'node:fs';
import { describe, expect, test } from 'vitest';
import { LegacyClient } from '../daemon/support/daemon-process.js';
import { PartialFrameFlood } from '../support/partial-frame-flood.js';
import { killAs, NOBODY, notRoot, onCleanup, sleep, startDaemonOpenToAll } from './support.js';

/** Sockets a process holds (from /proc/PID/fd). */
function sockets(pid: number): number {
  let n = 0;
  for (const fd of fs.readdirSync(`/proc/${pid}/fd`)) {
    try {
      if (fs.readlinkSync(`/proc/${pid}/fd/${fd}`).startsWith('socket:')) n++;
    } catch {
      /* closed meanwhile */
    }
  }
  return n;
}

/** A uid that is neither root nor -u's. */
const OTHER = 65533;

const status = (pid: number, field: string) =>
  new RegExp(`^${field}:\\s*(\\S+)`, 'm').exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1];

describe('the keeper under a flood of another user', () => {
  test('holds none of the flood, holds no capability, ignores the signals of another user, and restarts a killed serving process mid-flood; QEMU is answered', async (ctx) => {
    const why = notRoot();
    if (why) return ctx.skip(why);
    const { daemon, sock } = await startDaemonOpenToAll(['--keeper', '--frame-timeout', '3']);
    const keeper = daemon.proc.pid!;
    const serving = () => Number(fs.readFileSync(`/proc/${keeper}/task/${keeper}/children`, 'utf8').trim().split(/\s+/)[0]);
    const qemu = await LegacyClient.connect(sock);
    onCleanup(() => qemu.close());
    expect(await qemu.request(0x606, 0, process.pid)).toBe(0xa1003n);
    // What the keeper holds now (its stdio, the listening socket, its channel, QEMU's connection).
    await sleep(500);
    const held = sockets(keeper);
    for (const set of ['CapEff', 'CapPrm', 'CapBnd', 'CapInh', 'CapAmb']) expect(status(keeper, set), set).toBe('0000000000000000');

    const flood = await new PartialFrameFlood({ socketPath: sock, connections: 2000, bodyBytes: 16 * 1024, uid: NOBODY }).ready();
    onCleanup(() => flood.stop());
    await sleep(2000);
    expect(sockets(keeper), "the flood's connections are not the keeper's").toBe(held);
    // The keeper's real and saved uid are 0 (its effective uid -u's): neither another user nor -u's may signal it.
    expect(await killAs(OTHER, 'TERM', keeper), 'another user cannot signal the keeper').not.toBe(0);
    expect(await killAs(OTHER, 'KILL', keeper)).not.toBe(0);

    const first = serving();
    process.kill(first, 'SIGKILL');
    expect(await qemu.request(0x611, 0, process.pid), 'QEMU is answered by the next serving process').toBe(0x1000n);
    expect(serving()).not.toBe(first);
    await sleep(2000);
    expect(sockets(keeper), 'still only what it held before').toBe(held);
    expect(daemon.proc.exitCode, 'the keeper runs on').toBeNull();
    expect(daemon.stderr()).toMatch(/recovered from a crash: [^"]*1 QEMU connections kept/);
  }, 120_000);
});
