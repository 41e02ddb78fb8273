/** -d without fork(): the process re-spawns itself detached (setsid, stdio /dev/null, IPC) and exits once the child is ready or failed. */
import { spawn } from 'node:child_process';
import { cannot } from '../../common/errors.js';

export const DAEMON_CHILD_ENV = 'VMSR_HELPER_DAEMON_CHILD';

type ChildMessage = { type: 'ready'; pid: number } | { type: 'error'; message: string };

export function isDaemonChild(env: NodeJS.ProcessEnv = process.env): boolean {
  return env[DAEMON_CHILD_ENV] === '1' && typeof process.send === 'function';
}

/** In the parent: starts the detached child and resolves with its pid once it is ready. */
export function spawnDetached(argv: readonly string[], timeoutMs = 30_000): Promise<number> {
  const [node, script, ...args] = argv;
  if (!node || !script) return Promise.reject(new Error(cannot('re-run myself', 'process.argv has no script')));
  return new Promise((resolve, reject) => {
    const child = spawn(node, [...process.execArgv, script, ...args], {
      detached: true,
      stdio: ['ignore', 'ignore', 'ignore', 'ipc'],
      env: { ...process.env, [DAEMON_CHILD_ENV]: '1' },
    });
    // Called once: it removes every listener and the timer that could call it again.
    const finish = (err: Error | null, pid?: number) => {
      clearTimeout(timer);
      child.removeAllListeners();
      if (child.connected) child.disconnect();
      child.unref();
      if (err) reject(err);
      else resolve(pid ?? child.pid ?? 0);
    };
    const timer = setTimeout(() => {
      child.kill('SIGTERM');
      finish(new Error(`the background helper did not become ready within ${timeoutMs / 1000}s`));
    }, timeoutMs);
    child.on('message', (m: ChildMessage) => {
      if (m?.type === 'ready') finish(null, m.pid);
      else if (m?.type === 'error') finish(new Error(m.message));
    });
    child.on('error', (e) => finish(new Error(cannot(`start the background helper`, e.message))));
    child.on('exit', (code, signal) =>
      finish(new Error(`the background helper exited before it was ready (${signal ?? `exit code ${code}`})`)),
    );
  });
}

/** In the child: tells the parent we are ready and cuts the last link to it. */
export function reportReady(): void {
  if (typeof process.send !== 'function') return;
  process.send({ type: 'ready', pid: process.pid } satisfies ChildMessage, () => {
    if (process.connected) process.disconnect();
  });
}

/** In the child: hands the start-up error to the parent (which prints it), then resolves. */
export function reportFailure(message: string): Promise<void> {
  return new Promise((resolve) => {
    if (typeof process.send !== 'function' || !process.connected) return resolve();
    process.send({ type: 'error', message } satisfies ChildMessage, () => resolve());
  });
}
