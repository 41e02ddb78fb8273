/**
 * SIGHUP never ends the daemon or the exporter (Node's default would): QEMU does not reconnect to a helper that went away.
 * The daemon restarts in place (docs/daemon.md "Restarts"); the exporter has nothing to reload and logs so.
 */
import { listen, type Disposable, type EmitterLike } from '../common/disposable.js';
import { releaseSighupHold } from './sighup-hold.js';

export const SIGHUP_MESSAGE = 'SIGHUP: nothing to reload; logs go to stderr/journal';

interface InfoLog {
  info(msg: string): void;
  warn(fields: object, msg: string): void;
}

/** Runs `restart` on SIGHUP when given, else logs SIGHUP_MESSAGE; takes over from os/sighup-hold.ts. */
export function handleSighup(
  log: InfoLog,
  proc: EmitterLike<[]> = process as unknown as EmitterLike<[]>,
  restart?: () => void,
): Disposable {
  const listening = listen(proc, 'SIGHUP', () => (restart ? restart() : log.info(SIGHUP_MESSAGE)));
  // Ours is in place: the guard's hold (an image the daemon executed) goes, and says what it held.
  const held = releaseSighupHold();
  if (held > 0) log.warn({ held }, 'SIGHUP received while this image started: ignored (one restart at a time)');
  return listening;
}
