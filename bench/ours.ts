/** Our helper as a user runs it: a real daemon process (as root it re-executes itself, flags included). */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import { canConnect, HELPER_BIN } from './tools.js';

export interface Ours {
  pid: number;
  socket: string;
  stop(): Promise<void>;
}

export async function startOurs(socket: string, hostArgs: string[], extra: string[] = []): Promise<Ours> {
  const child = spawn(process.execPath, [HELPER_BIN, '-k', socket, ...hostArgs, '-q', ...extra], { stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  child.stderr!.on('data', (d: Buffer) => (err += d.toString()));
  const end = Date.now() + 20_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`our helper exited at start: ${err.trim()}`);
    if (Date.now() > end) {
      child.kill('SIGKILL');
      throw new Error(`our helper did not listen within 20 s: ${err.trim()}`);
    }
    if (fs.existsSync(socket) && (await canConnect(socket))) break;
    await new Promise((r) => setTimeout(r, 10));
  }
  return {
    pid: child.pid!,
    socket,
    stop: () =>
      new Promise<void>((resolve) => {
        if (child.exitCode !== null || child.signalCode !== null) return resolve();
        child.once('exit', () => resolve());
        child.kill('SIGTERM');
      }),
  };
}
