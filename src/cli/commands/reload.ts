/** `vmsr-helper reload` (docs/daemon.md "Restarts"): SIGHUP to the socket's peer (not systemd's), then waits for the new image. */
import net from 'node:net';
import os from 'node:os';
import type { Command } from 'commander';
import { V2Client } from '../../client/v2-client.js';
import { peerOf } from '../../os/peer.js';
import { isHelperProcess } from '../../helper/lifecycle/pidfile.js';
import { addClientSocketOption, clientSocket, commandOptions } from '../options.js';
import { cannot, cannotError } from '../../common/errors.js';
import { RESTART_CHECK_TIMEOUT_MS, RESTART_QUIET_MS } from '../../helper/handover/restarter.js';

/** Longest wait for the restart to begin: the daemon's quiet time and binary check, and 30 s for a busy host (a starved one took 9 s to check). */
const BEGIN_TIMEOUT_MS = RESTART_QUIET_MS + RESTART_CHECK_TIMEOUT_MS + 30_000;
/** Longest wait, once the old image let go, for the new one to serve (its start took 10 s on a starved host). */
const SERVE_TIMEOUT_MS = 60_000;

function listenerPid(socketPath: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.connect({ path: socketPath });
    s.once('error', (e) =>
      reject(cannotError(`connect to ${socketPath}`, e.message, 'is the helper running there? give its socket with -k')),
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

/** Where a reload is, for what it says when it is stopped or gives up. */
interface Progress {
  pid: number | null;
  /** Date.now() at the SIGHUP, or null before it. */
  signalledAt: number | null;
  waitingFor: string;
}

/** A reload stopped by SIGTERM or SIGINT says where it was and exits 128 + the signal's number. */
function sayWhereWhenStopped(socketPath: string, p: Progress): () => void {
  const handlers = (['SIGTERM', 'SIGINT'] as const).map((sig) => {
    const h = () => {
      const why =
        p.signalledAt === null
          ? `stopped by ${sig} before the helper was signalled`
          : `stopped by ${sig} while waiting for the helper (pid ${p.pid}) to ${p.waitingFor}, ${((Date.now() - p.signalledAt) / 1000).toFixed(1)} s after its SIGHUP`;
      const fix =
        p.signalledAt === null
          ? 'nothing was restarted: run it again'
          : `the helper goes on with the restart: its log says how it ended, and vmsr-helper stats --once -k ${socketPath} whether it serves`;
      process.stderr.write(`vmsr-helper reload: ${cannot('reload', why, fix)}\n`);
      process.exit(128 + os.constants.signals[sig]);
    };
    process.on(sig, h);
    return [sig, h] as const;
  });
  return () => handlers.forEach(([sig, h]) => process.off(sig, h));
}

/** Sends the daemon at `socketPath` SIGHUP and resolves with the ms until a new connection is served by the new image. */
async function reloadDaemon(socketPath: string, p: Progress): Promise<number> {
  const pid = await listenerPid(socketPath);
  if (pid === 1) throw cannotError('reload', `${socketPath} is systemd's socket`, 'run systemctl reload qemu-vmsr-helper (or restart)');
  if (!isHelperProcess(pid))
    throw cannotError('reload', `pid ${pid} listening on ${socketPath} is not a vmsr-helper`, "give the helper's socket with -k");
  // A v2 connection is told when the restart begins (ERROR RESTARTING, then closed).
  const watch = await V2Client.connect(socketPath);
  await watch.list();
  p.pid = pid;
  try {
    process.kill(pid, 'SIGHUP');
  } catch (e) {
    await watch.close();
    throw new Error(signalRefused(pid, e as NodeJS.ErrnoException));
  }
  const t0 = (p.signalledAt = Date.now());
  p.waitingFor = 'begin the restart';
  const began = await Promise.race([
    watch.closed.then(() => true),
    new Promise<false>((r) => setTimeout(() => r(false), BEGIN_TIMEOUT_MS).unref()),
  ]);
  if (!began) {
    await watch.close();
    const why = `the helper (pid ${pid}) did not begin the restart within ${BEGIN_TIMEOUT_MS / 1000} s of its SIGHUP`;
    throw cannotError('reload', why, 'its log says why (journalctl or its stderr)');
  }
  p.waitingFor = 'serve again (its new image starting)';
  for (const end = Date.now() + SERVE_TIMEOUT_MS; Date.now() < end;) {
    try {
      const c = await V2Client.connect(socketPath, { timeoutMs: 1000 });
      await c.list();
      await c.close();
      return Date.now() - t0;
    } catch {
      await new Promise((r) => setTimeout(r, 20));
    }
  }
  const why = `the helper (pid ${pid}) began the restart but did not serve again within ${SERVE_TIMEOUT_MS / 1000} s`;
  throw cannotError('reload', why, 'its log says why (journalctl or its stderr)');
}

export function addReloadCommand(program: Command): void {
  const cmd = program
    .command('reload')
    .description('restart the daemon in place (as SIGHUP): every QEMU connection and all counters carried over');
  addClientSocketOption(cmd).action(async () => {
    const o = commandOptions<{ socket?: string }>(cmd);
    const socketPath = clientSocket(o);
    const progress: Progress = { pid: null, signalledAt: null, waitingFor: '' };
    const unhook = sayWhereWhenStopped(socketPath, progress);
    const ms = await reloadDaemon(socketPath, progress).finally(unhook);
    process.stdout.write(`restarted in place; serving again ${ms} ms after the signal\n`);
  });
}
