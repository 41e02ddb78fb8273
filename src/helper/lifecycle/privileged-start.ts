/** As root: the start-up steps, then a re-exec with every privilege dropped (no thread holds any capability); their fds cross it. */
import type { DaemonConfig } from './config.js';
import { inheritEnv, inheritedFds, renumbered, type Inherited } from '../handover/inherited.js';
import { inheritFromEnvironment } from './systemd.js';
import { KEEPER_ENV, KEEPER_FIRST_FD, type KeeperImage } from '../../keeper/keeper-messages.js';
import { openStart } from './startup.js';
import { DAEMON_CHILD_ENV, isDaemonChild } from './daemonize.js';
import { daemonArgv, reexecInPlace } from '../../os/privileges/reexec.js';
import { dropPrivileges } from '../../os/privileges/capabilities.js';
import { cannot } from '../../common/errors.js';

/** The first image's start: the steps (a failure undoes them and throws), then the re-exec into the daemon or the keeper; never returns. */
export async function startPrivileged(config: DaemonConfig, writeFiles: readonly string[], keeper?: { level: string }): Promise<never> {
  const opened = await openStart(config, inheritFromEnvironment(config.socketPathGiven), { files: writeFiles });
  const inherited: Inherited = { ...opened.handover('reexec'), dropped: true };
  const keep = inheritedFds(inherited);
  // The keeper's image: what the start opened, and how each serving process finds it.
  const image: KeeperImage | undefined = keeper && {
    command: daemonArgv(),
    fds: inheritedFds(inherited),
    env: inheritEnv(renumbered(inherited, KEEPER_FIRST_FD)),
    level: keeper.level,
    ...(inherited.listener?.file ? { socketFile: inherited.listener.file } : {}),
    ...(inherited.pidfile !== undefined ? { pidfile: inherited.pidfile } : {}),
  };
  const env = image ? { [KEEPER_ENV.image]: JSON.stringify(image) } : inheritEnv(inherited);
  // -d: the IPC link to the foreground process (Node removed NODE_CHANNEL_FD from env at start).
  const channel = (process as { channel?: { fd?: number } }).channel?.fd;
  if (channel !== undefined && channel >= 0) {
    keep.push(channel);
    env.NODE_CHANNEL_FD = String(channel);
  }
  // The re-exec passes only allowlisted variables (os/privileges/reexec.ts): -d's marker is named here.
  if (isDaemonChild()) env[DAEMON_CHILD_ENV] = '1';
  try {
    // Dropped on the main thread, then exec: every thread of the new image has no capability, NoNewPrivs 1, the asked uid/gid.
    dropPrivileges({
      ...(config.uid !== undefined ? { uid: config.uid, realUidRoot: keeper !== undefined } : {}),
      ...(config.gid !== undefined ? { gid: config.gid } : {}),
    });
    reexecInPlace(keep, env);
  } catch (e) {
    await opened.close();
    throw new Error(cannot(`drop privileges`, (e as Error).message));
  }
}
