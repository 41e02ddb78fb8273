/**
 * SIGHUP across the daemon's own exec (a restart in place, the start-up re-exec): no SIGHUP may end
 * the process between the old image's exec and the new image's handler (docs/security.md, "A second
 * SIGHUP during a restart").
 *
 * What crosses and what does not (measured on Node 20, /proc/PID/status): a disposition of SIG_IGN
 * survives execve, so the old image sets it (os/privileges/reexec.ts, ignoreSignal) just before it
 * executes; but Node's start-up (PlatformInit) puts every signal but SIGPIPE and SIGXFSZ back to
 * SIG_DFL and empties the signal mask, before any JavaScript runs. From there until a listener is
 * installed, a SIGHUP ends the process. So the executable's first module (src/bin/guard.ts) installs
 * a listener that holds SIGHUP (holdSighupAfterExec) in every image the daemon executed (marked by
 * SIGHUP_HELD_ENV), before the rest of the program is even loaded; the daemon's own handler takes
 * over (releaseSighupHold, from os/sighup.ts) and tells how many it held. What is left is Node's own
 * start, before the first module: docs/security.md gives its length and what bounds it.
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

/**
 * Removes the holding listener (call it once the caller's own SIGHUP listener is in place, so the
 * signal is never without one) and returns how many SIGHUPs it held: 0 when nothing was held.
 */
export function releaseSighupHold(): number {
  if (holding === null) return 0;
  process.removeListener('SIGHUP', holding);
  holding = null;
  const n = held;
  held = 0;
  return n;
}
