/**
 * No SIGHUP may end the daemon between its exec and the new image's handler (docs/security.md, "A second SIGHUP during a
 * restart"): Node's start-up resets SIG_IGN, so src/bin/guard.ts holds SIGHUP until releaseSighupHold(). No imports here.
 */

/** Set by the image that executes the daemon again; the new image holds SIGHUP until its handler is in place. */
export const SIGHUP_HELD_ENV = 'VMSR_HELPER_SIGHUP_HELD';

let held = 0;
let holding: (() => void) | null = null;

/** With SIGHUP_HELD_ENV set (removed here): a SIGHUP listener that only counts. Returns whether it holds. */
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
