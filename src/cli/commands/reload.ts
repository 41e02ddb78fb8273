/**
 * `vmsr-helper reload -k SOCKET`: restarts the daemon listening there in place (docs/daemon.md
 * "Restarts"), as SIGHUP does, and waits until the new image serves. The daemon is found by the
 * socket's peer credentials (the process that listens); a socket systemd listens on (pid 1) is
 * refused: use `systemctl reload` (ExecReload= sends the daemon SIGHUP) or `systemctl restart`.
 */
import net from 'node:net';
import type { Command } from 'commander';
import { V2Client } from '../../client/v2-client.js';
import { DEFAULT_HELPER_SOCKET } from '../../protocol/socket-path.js';
import { peerOf } from '../../os/peer.js';
import { isHelperProcess } from '../../helper/lifecycle/pidfile.js';
import { addClientSocketOption, commandOptions } from '../options.js';
import { cannot } from '../../common/errors.js';

/** Longest wait for the daemon to begin the restart (its check of the binary included), then to serve again. */
const RELOAD_TIMEOUT_MS = 30_000;

function listenerPid(socketPath: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.connect({ path: socketPath });
    s.once('error', (e) =>
      reject(new Error(cannot(`connect to ${socketPath}`, e.message, 'is the helper running there? give its socket with -k'))),
    );
    s.once('connect', () => {
      try {
        resolve(peerOf(s).pid);
      } catch (e) {
        reject(e as Error);
      } finally {
        s.destroy();
      }
    });
  });
}

/** Why SIGHUP could not be sent to the daemon, and the fix (EPERM: it runs as another user). */
function signalRefused(pid: number, e: NodeJS.ErrnoException): string {
  if (e.code === 'EPERM')
    return cannot(
      'reload',
      `not allowed to signal the helper (pid ${pid}): it runs as another user, and only root or that user (with a keeper, root alone) may restart it`,
      'run it as root (sudo vmsr-helper reload), or systemctl reload qemu-vmsr-helper',
    );
  return cannot('reload', `cannot send SIGHUP to the helper (pid ${pid}): ${e.message}`, 'check that it still runs');
}

/** Sends the daemon at `socketPath` SIGHUP and resolves with the ms until a new connection is served by the new image. */
async function reloadDaemon(socketPath: string, timeoutMs = RELOAD_TIMEOUT_MS): Promise<number> {
  const pid = await listenerPid(socketPath);
  if (pid === 1)
    throw new Error(cannot('reload', `${socketPath} is systemd's socket`, 'run systemctl reload qemu-vmsr-helper (or restart)'));
  if (!isHelperProcess(pid))
    throw new Error(cannot('reload', `pid ${pid} listening on ${socketPath} is not a vmsr-helper`, "give the helper's socket with -k"));
  // A v2 connection is told when the restart begins (ERROR RESTARTING, then closed).
  const watch = await V2Client.connect(socketPath);
  await watch.list();
  const t0 = Date.now();
  try {
    process.kill(pid, 'SIGHUP');
  } catch (e) {
    await watch.close();
    throw new Error(signalRefused(pid, e as NodeJS.ErrnoException));
  }
  const began = await Promise.race([
    watch.closed.then(() => true),
    new Promise<false>((r) => setTimeout(() => r(false), timeoutMs).unref()),
  ]);
  if (!began) {
    await watch.close();
    throw new Error(
      cannot(
        'reload',
        `the helper (pid ${pid}) did not begin the restart within ${timeoutMs / 1000} s`,
        'its log says why (journalctl or its stderr)',
      ),
    );
  }
  for (const end = Date.now() + timeoutMs; Date.now() < end;) {
    try {
      const c = await V2Client.connect(socketPath, { timeoutMs: 1000 });
      await c.list();
      await c.close();
      return Date.now() - t0;
    } catch {
      await new Promise((r) => setTimeout(r, 20));
    }
  }
  throw new Error(cannot('reload', `the helper did not serve again within ${timeoutMs / 1000} s`, 'its log says why'));
}

export function addReloadCommand(program: Command): void {
  const cmd = program
    .command('reload')
    .description('restart the daemon in place (as SIGHUP): every QEMU connection and all counters carried over');
  addClientSocketOption(cmd).action(async () => {
    const o = commandOptions<{ socket?: string }>(cmd);
    const ms = await reloadDaemon(o.socket ?? DEFAULT_HELPER_SOCKET);
    process.stdout.write(`restarted in place; serving again ${ms} ms after the signal\n`);
  });
}
