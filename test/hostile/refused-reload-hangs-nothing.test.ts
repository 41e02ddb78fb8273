/**
 * `vmsr-helper reload` run by a user who may not signal the daemon (a socket-group member that is
 * neither root nor the daemon's -u user) printed `kill EPERM` and then hung: the v2 connection it
 * had opened to watch the restart kept the command alive. The refusal itself held (nothing
 * restarted). Now it exits non-zero at once, saying why and what to run instead.
 */
import { describe, expect, test } from 'vitest';
import { LegacyClient, spawnHelper } from '../daemon/support/daemon-process.js';
import { notRoot, onCleanup, startDaemonOpenToAll, track } from './support.js';

/** A uid that is neither root nor the daemon's -u nobody: it may connect (socket mode 0666) but not signal. */
const OTHER_USER = 65533;
/** Far above what the refusal takes (one connect, one LIST, one kill): it waited for ever before. */
const EXIT_DEADLINE_MS = 20_000;

describe('a refused reload', () => {
  test('vmsr-helper reload exits non-zero at once with the reason and the fix when the daemon may not be signalled (EPERM)', async (ctx) => {
    const why = notRoot();
    if (why) return ctx.skip(why);
    const { daemon, sock } = await startDaemonOpenToAll();
    const qemu = await LegacyClient.connect(sock);
    onCleanup(() => qemu.close());
    const reload = track(spawnHelper(['reload', '-k', sock], { uid: OTHER_USER, gid: OTHER_USER }));
    const code = await Promise.race([reload.exited, new Promise<string>((r) => setTimeout(() => r('still running'), EXIT_DEADLINE_MS))]);
    expect(code, `reload's output: ${reload.stderr()}`).toBe(1);
    expect(reload.stderr()).toMatch(/cannot reload: not allowed to signal the helper \(pid \d+\)/);
    expect(reload.stderr()).toContain('sudo vmsr-helper reload');
    // Nothing restarted: the daemon serves the same connection, and logged no restart.
    expect(await qemu.request(0x606, 0, process.pid)).toBe(0xa1003n);
    expect(daemon.stderr()).not.toContain('restart in place');
  });
});
