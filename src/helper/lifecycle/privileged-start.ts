/**
 * As root, the start-up steps (startup.ts: checks, MSR devices, listening socket, pidfile, --record
 * files) run in the first image, before the helper re-executes itself with dropped privileges
 * (os/privileges/reexec.ts). What they opened crosses the exec as an Inherited (inherited.ts); the
 * new image adopts it and runs the same start-up, which finds every step done.
 */
import type { DaemonConfig } from './config.js';
import { inheritFromEnvironment, type Inherited } from './inherited.js';
import { openStart } from './startup.js';

/**
 * Runs the steps; on failure undoes what was done (the socket file, the pidfile) and throws the
 * step's error. `inherited` is for the re-executed image, whose privileges the exec drops; `undo` is
 * for a failure after this returns (the exec itself).
 */
export async function openPrivileged(
  config: DaemonConfig,
  writeFiles: readonly string[] = [],
): Promise<{ inherited: Inherited; undo(): Promise<void> }> {
  const opened = await openStart(config, inheritFromEnvironment(config.socketPathGiven), { files: writeFiles });
  // The exec that carries it is reexecDropped's: the new image starts with its privileges dropped.
  return { inherited: { ...opened.handover('reexec'), dropped: true }, undo: () => opened.close() };
}
