/**
 * What SIGHUP does, in one place for the daemon and the exporter. Node's default for SIGHUP is to
 * end the process, and QEMU does not reconnect to a helper that went away: a log-rotation style
 * `kill -HUP` would freeze every guest's energy counter. So SIGHUP is caught and only logged: there
 * is nothing to reload, and logs go to stderr or the journal (no file to reopen).
 *
 * A later change will make SIGHUP re-execute the daemon in place (a restart that keeps the socket):
 * it belongs here.
 */
import { listen, type Disposable, type EmitterLike } from '../common/disposable.js';

export const SIGHUP_MESSAGE = 'SIGHUP: nothing to reload; logs go to stderr/journal';

export interface InfoLog {
  info(msg: string): void;
}

/** Catches SIGHUP on `proc` (the process) and logs SIGHUP_MESSAGE at info; dispose to stop. */
export function handleSighup(log: InfoLog, proc: EmitterLike<[]> = process as unknown as EmitterLike<[]>): Disposable {
  return listen(proc, 'SIGHUP', () => log.info(SIGHUP_MESSAGE));
}
