/**
 * The serving process's watchdog (src/helper/lifecycle/loop-watchdog.ts) in a real Node process:
 * an event loop that stops turning ends the process by SIGALRM (the keeper or systemd then starts it
 * again), a SIGTERM handler it cannot run included; a loop that turns is left alone.
 */
import { spawn } from 'node:child_process';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { describe, expect, test } from 'vitest';

const MODULE = pathToFileURL(path.resolve('dist/src/helper/lifecycle/loop-watchdog.js')).href;
const STALL_S = 2;

/** A Node process with the watchdog (STALL_S) and a SIGTERM handler; `hang`: its loop then never turns again. */
function child(hang: boolean): {
  done: Promise<{ code: number | null; signal: NodeJS.Signals | null; ms: number }>;
  armed: Promise<void>;
  pid: number;
} {
  const script = `
    const { startLoopWatchdog } = await import(${JSON.stringify(MODULE)});
    startLoopWatchdog(${STALL_S});
    process.on('SIGTERM', () => process.exit(0));
    console.log('armed');
    if (${hang}) { const t = Date.now(); for (;;) if (Date.now() < t) break; }
    setTimeout(() => process.exit(0), ${(STALL_S + 3) * 1000});
  `;
  const c = spawn(process.execPath, ['--input-type=module', '-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
  const t0 = Date.now();
  const armed = new Promise<void>((resolve) => c.stdout.on('data', () => resolve()));
  const done = new Promise<{ code: number | null; signal: NodeJS.Signals | null; ms: number }>((resolve) =>
    c.once('exit', (code, signal) => resolve({ code, signal, ms: Date.now() - t0 })),
  );
  return { done, armed, pid: c.pid! };
}

describe('the event loop watchdog', () => {
  test('ends a process whose event loop hangs by SIGALRM, a SIGTERM it cannot handle notwithstanding', async () => {
    const c = child(true);
    await c.armed;
    process.kill(c.pid, 'SIGTERM'); // its handler never runs: the loop is stuck
    const r = await Promise.race([c.done, new Promise<null>((res) => setTimeout(() => res(null), 60_000))]);
    if (r === null) process.kill(c.pid, 'SIGKILL');
    // Waited for: the exit, at most 60 s (STALL_S after it armed on an idle machine).
    expect(r?.signal).toBe('SIGALRM');
  }, 90_000);

  test('leaves a process whose event loop turns alone past the stall limit', async () => {
    const c = child(false);
    const r = await c.done;
    expect(r).toMatchObject({ code: 0, signal: null });
    expect(r.ms).toBeGreaterThan((STALL_S + 2) * 1000);
  }, 90_000);
});
