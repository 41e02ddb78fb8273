/**
 * systemd integration on real parts: socket activation through systemd-socket-activate, sd_notify
 * received on real AF_UNIX datagram sockets (path and abstract), the watchdog keep-alive.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { FakeHost } from '../support/fake-host.js';
import { missing } from '../support/env.js';
import { BIN, hostArgs, LegacyClient, spawnHelper, startHelper, tempDir, waitFor, type DaemonChild } from './support/daemon-process.js';
import { NotifyReceiver } from './support/notify-socket.js';

const cleanups: (() => void | Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function setup(): { host: FakeHost; dir: string } {
  const host = new FakeHost();
  host.writePackageMsr(0, 0x606, 0xa1003n);
  const dir = tempDir();
  cleanups.push(() => {
    host.cleanup();
    fs.rmSync(dir, { recursive: true, force: true });
  });
  return { host, dir };
}

function track(child: DaemonChild): DaemonChild {
  cleanups.push(() => child.stop('SIGKILL'));
  return child;
}

function activated(sock: string | string[], env: string[], args: string[]): DaemonChild {
  const listen = (Array.isArray(sock) ? sock : [sock]).flatMap((s) => ['-l', s]);
  return track(
    spawnHelper(args, { command: ['systemd-socket-activate', ...listen, ...env.flatMap((e) => ['-E', e]), process.execPath, BIN] }),
  );
}

describe('socket activation (systemd-socket-activate)', () => {
  test('serves on the passed fd, notifies READY with its own pid, and leaves the socket it did not create', async (ctx) => {
    const why = missing({ command: 'systemd-socket-activate' });
    if (why) return ctx.skip(why);
    const { host, dir } = setup();
    const sock = path.join(dir, 'act.sock');
    const notify = new NotifyReceiver(path.join(dir, 'notify'));
    cleanups.push(() => notify.close());
    const child = activated(sock, [`NOTIFY_SOCKET=${notify.name}`], hostArgs(host));
    await waitFor(() => fs.existsSync(sock), 'systemd-socket-activate to listen', child);
    // the first connection makes systemd-socket-activate exec the helper with LISTEN_FDS=1
    const c = await LegacyClient.connect(sock);
    expect(await c.request(0x606, 0, process.pid)).toBe(0xa1003n);
    await waitFor(() => notify.messages.some((m) => m.includes('READY=1')), 'READY=1', child);
    const ready = notify.messages.find((m) => m.includes('READY=1'))!;
    expect(ready).toContain(`MAINPID=${child.proc.pid}`); // exec'd: LISTEN_PID was the helper's pid
    expect(ready).toMatch(/STATUS=listening on systemd socket \(fd 3\)/);
    c.close();
    expect(await child.stop('SIGTERM')).toBe(0);
    notify.drain();
    expect(notify.messages.some((m) => m.includes('STOPPING=1'))).toBe(true);
    expect(fs.existsSync(sock)).toBe(true); // systemd's socket, not ours to remove
  });

  test('-k together with socket activation is an error, as in qemu-vmsr-helper', async (ctx) => {
    const why = missing({ command: 'systemd-socket-activate' });
    if (why) return ctx.skip(why);
    const { host, dir } = setup();
    const sock = path.join(dir, 'act.sock');
    const child = activated(sock, [], ['-k', path.join(dir, 'other.sock'), ...hostArgs(host)]);
    await waitFor(() => fs.existsSync(sock), 'systemd-socket-activate to listen', child);
    const c = await LegacyClient.connect(sock);
    expect(await child.exited).toBe(1);
    expect(child.stderr()).toMatch(/-k\) cannot be set when using socket activation/);
    c.close();
  });

  test('LISTEN_FDS > 1 is an error', async (ctx) => {
    const why = missing({ command: 'systemd-socket-activate' });
    if (why) return ctx.skip(why);
    const { host, dir } = setup();
    const socks = [path.join(dir, 'a.sock'), path.join(dir, 'b.sock')];
    const child = activated(socks, [], hostArgs(host));
    await waitFor(() => socks.every((s) => fs.existsSync(s)), 'systemd-socket-activate to listen', child);
    const c = await LegacyClient.connect(socks[0]!);
    expect(await child.exited).toBe(1);
    expect(child.stderr()).toMatch(/LISTEN_FDS > 1 is not supported \(got 2\)/);
    c.close();
  });
});

describe('sd_notify and watchdog', () => {
  test('abstract NOTIFY_SOCKET gets READY, STATUS, WATCHDOG=1 every WATCHDOG_USEC/2, then STOPPING', async () => {
    const { host, dir } = setup();
    const notify = new NotifyReceiver(`@vmsr-helper-test-${process.pid}-${Date.now()}`);
    cleanups.push(() => notify.close());
    const child = track(
      await startHelper(['-k', path.join(dir, 's.sock'), ...hostArgs(host)], {
        env: { ...process.env, NOTIFY_SOCKET: notify.name, WATCHDOG_USEC: '200000' },
      }),
    );
    await waitFor(() => notify.messages.filter((m) => m === 'WATCHDOG=1').length >= 4, 'four watchdog keep-alives', child, 3000);
    const readyAt = notify.messages.findIndex((m) => m.startsWith('READY=1'));
    expect(readyAt).toBeGreaterThanOrEqual(0);
    expect(notify.messages[readyAt]).toMatch(/STATUS=listening on .*s\.sock/);
    expect(await child.stop('SIGTERM')).toBe(0);
    notify.drain();
    expect(notify.messages.at(-1)).toContain('STOPPING=1');
  });

  test('WATCHDOG_PID of another process: no keep-alives', async () => {
    const { host, dir } = setup();
    const notify = new NotifyReceiver(path.join(dir, 'notify'));
    cleanups.push(() => notify.close());
    const child = track(
      await startHelper(['-k', path.join(dir, 's.sock'), ...hostArgs(host)], {
        env: { ...process.env, NOTIFY_SOCKET: notify.name, WATCHDOG_USEC: '100000', WATCHDOG_PID: '1' },
      }),
    );
    await waitFor(() => notify.messages.some((m) => m.startsWith('READY=1')), 'READY=1', child);
    await new Promise((r) => setTimeout(r, 300));
    expect(notify.messages.filter((m) => m === 'WATCHDOG=1')).toEqual([]);
  });
});
