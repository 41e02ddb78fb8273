/**
 * Keeps Node's inspector shut: SIGUSR1 from any process of our uid opens it, and whoever connects runs code in the daemon
 * (docs/security.md, "A debugger opened by SIGUSR1"). A JS listener replaces Node's handler: installed first (src/bin/guard.ts).
 */
import fs from 'node:fs';
import inspector from 'node:inspector';

export const SIGUSR1_MESSAGE = "SIGUSR1 ignored: it would open Node's inspector";
/** At most one SIGUSR1 warning per this many ms; the ones held back are counted in the next. */
const SIGUSR1_LOG_EVERY_MS = 60_000;

/** A JSON line on stderr shaped like the logger's: the guard runs before any logger exists, and must not wait for one. */
function warnLine(msg: string, fields: Record<string, unknown>): void {
  try {
    fs.writeSync(2, `${JSON.stringify({ level: 'warn', time: Date.now(), pid: process.pid, msg, ...fields })}\n`);
  } catch {
    /* stderr closed: nothing to tell */
  }
}

/** Closes the inspector if it is open; returns the URL it had, else null. */
export function closeOpenInspector(): string | null {
  const url = inspector.url();
  if (url === undefined) return null;
  inspector.close();
  return url;
}

let installed = false;

/** Installs the SIGUSR1 listener (once) and closes an inspector already open. Returns the listener. */
export function installSigusr1Guard(now: () => number = Date.now, warn: typeof warnLine = warnLine): () => void {
  let lastLog = -Infinity;
  let heldBack = 0;
  const onUsr1 = () => {
    const closed = closeOpenInspector();
    const t = now();
    if (t - lastLog < SIGUSR1_LOG_EVERY_MS && closed === null) {
      heldBack++;
      return;
    }
    lastLog = t;
    warn(SIGUSR1_MESSAGE, { heldBack, ...(closed !== null ? { inspectorClosed: closed } : {}) });
    heldBack = 0;
  };
  if (!installed) {
    installed = true;
    process.on('SIGUSR1', onUsr1);
    const closed = closeOpenInspector();
    if (closed !== null)
      warn('inspector closed at start: a debugger must not reach this process (drop --inspect and NODE_OPTIONS)', {
        inspectorClosed: closed,
      });
  }
  return onUsr1;
}
