/**
 * As root, the start-up steps (startup.ts: checks, MSR devices, listening socket, pidfile, --record
 * files) run in the first image, and then the helper re-executes itself with every privilege dropped
 * (os/privileges/reexec.ts), so that no thread of the new image holds any capability. What the steps
 * opened crosses the exec as an Inherited (handover/inherited.ts); the new image adopts it and runs
 * the same start-up, which finds every step done. With a keeper, the new image is the keeper, which
 * passes the same to every serving process it starts (keeperImage).
 */
import type { DaemonConfig } from './config.js';
import { inheritEnv, inheritedFds, renumbered, type Inherited } from '../handover/inherited.js';
import { inheritFromEnvironment } from './systemd.js';
import { KEEPER_ENV, KEEPER_FIRST_FD } from '../../keeper/keeper-messages.js';
import type { KeeperImage } from '../../keeper/keeper-image.js';
import { openStart } from './startup.js';
import { DAEMON_CHILD_ENV, isDaemonChild } from './daemonize.js';
import { daemonArgv, reexecDropped } from '../../os/privileges/reexec.js';
import { cannot } from '../../common/errors.js';

/**
 * Runs the steps; on failure undoes what was done (the socket file, the pidfile) and throws the
 * step's error. `inherited` is for the re-executed image, whose privileges the exec drops; `undo` is
 * for a failure after this returns (the exec itself).
 */
async function openPrivileged(
  config: DaemonConfig,
  writeFiles: readonly string[] = [],
): Promise<{ inherited: Inherited; undo(): Promise<void> }> {
  const opened = await openStart(config, inheritFromEnvironment(config.socketPathGiven), { files: writeFiles });
  // The exec that carries it is reexecDropped's: the new image starts with its privileges dropped.
  return { inherited: { ...opened.handover('reexec'), dropped: true }, undo: () => opened.close() };
}

/** KEEPER_ENV.image for the keeper's image: what the start opened, and how each serving process finds it. */
function keeperImageEnv(inherited: Inherited, level: string): Record<string, string> {
  const image: KeeperImage = {
    command: daemonArgv(),
    fds: inheritedFds(inherited),
    env: inheritEnv(renumbered(inherited, KEEPER_FIRST_FD)),
    level,
    ...(inherited.listener?.file ? { socketFile: inherited.listener.file } : {}),
    ...(inherited.pidfile !== undefined ? { pidfile: inherited.pidfile } : {}),
  };
  return { [KEEPER_ENV.image]: JSON.stringify(image) };
}

/**
 * The first image's start: the steps run (as root: what needs root), then the re-exec with every
 * privilege dropped and the opened fds, into the daemon or, with `keeper`, into the keeper
 * (KEEPER_ENV.image, keeper/keeper-image.ts). Returns only by throwing (the steps failed, or the exec did: what they opened undone).
 */
export async function startPrivileged(config: DaemonConfig, writeFiles: readonly string[], keeper?: { level: string }): Promise<never> {
  const { inherited, undo } = await openPrivileged(config, writeFiles);
  const keep = inheritedFds(inherited);
  const env = keeper ? keeperImageEnv(inherited, keeper.level) : inheritEnv(inherited);
  // -d: the IPC link to the foreground process (Node removed NODE_CHANNEL_FD from env at start).
  const channel = (process as { channel?: { fd?: number } }).channel?.fd;
  if (channel !== undefined && channel >= 0) {
    keep.push(channel);
    env.NODE_CHANNEL_FD = String(channel);
  }
  // The re-exec passes only allowlisted variables (os/privileges/reexec.ts): -d's marker is named here.
  if (isDaemonChild()) env[DAEMON_CHILD_ENV] = '1';
  try {
    reexecDropped(
      {
        ...(config.uid !== undefined ? { uid: config.uid, realUidRoot: keeper !== undefined } : {}),
        ...(config.gid !== undefined ? { gid: config.gid } : {}),
      },
      keep,
      env,
    );
  } catch (e) {
    await undo();
    throw new Error(cannot(`drop privileges`, (e as Error).message));
  }
}
