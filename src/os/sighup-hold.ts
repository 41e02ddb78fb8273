/**
 * SIGHUP across the daemon's own exec: no SIGHUP may end the process between the old image's exec and
 * the new image's handler (docs/security.md, "A second SIGHUP during a restart"). SIG_IGN survives
 * execve, but Node's start-up puts SIGHUP back to SIG_DFL before any JavaScript runs, so the first
 * module (src/bin/guard.ts) holds SIGHUP in every image the daemon executed, until the daemon's own
 * handler takes over (releaseSighupHold).
 *
 * Keep this module's imports to none: the guard evaluates it before everything else.
 */

/** Set by the image that executes the daemon again; the new image holds SIGHUP until its handler is in place. */
export const SIGHUP_HELD_ENV = 'VMSR_HELPER_SIGHUP_HELD';

let held = 0;
let holding: (() => void) | null = null;

/**
 * In an image the daemon executed (SIGHUP_HELD_ENV set, and removed here): a SIGHUP listener that
 * only counts, until releaseSighupHold(). Returns whether it holds.
 */
export function holdSighupAfterExec(env: NodeJS.ProcessEnv = process.env): boolean {
  if (env[SIGHUP_HELD_ENV] === undefined) return false;
  delete env[SIGHUP_HELD_ENV];
  if (holding !== null) return true;
  holding = () => void held++;
  process.on('SIGHUP', holding);
  return true;
}

/** Call once the caller's own SIGHUP listener is in place: removes the holding one, returns how many it held. */
export function releaseSighupHold(): number {
  if (holding === null) return 0;
  process.removeListener('SIGHUP', holding);
  holding = null;
  const n = held;
  held = 0;
  return n;
}
