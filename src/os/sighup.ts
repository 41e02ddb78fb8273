/**
 * What SIGHUP does, in one place for the daemon and the exporter. Node's default for SIGHUP is to
 * end the process, and QEMU does not reconnect to a helper that went away, so SIGHUP never stops
 * anything. The daemon restarts in place on it (helper/handover/restarter.ts: the installed binary
 * executed again, every connection and the live state handed over; docs/daemon.md "Restarts"); the
 * exporter has nothing to reload and logs so (logs go to stderr or the journal: no file to reopen).
 */
import { listen, type Disposable, type EmitterLike } from '../common/disposable.js';
import { releaseSighupHold } from './sighup-hold.js';

export const SIGHUP_MESSAGE = 'SIGHUP: nothing to reload; logs go to stderr/journal';

interface InfoLog {
  info(msg: string): void;
  warn(fields: object, msg: string): void;
}

/**
 * Catches SIGHUP on `proc` (the process): runs `restart` when given, else logs SIGHUP_MESSAGE at
 * info; dispose to stop. Takes over from the hold of an image the daemon executed (os/sighup-hold.ts).
 */
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
