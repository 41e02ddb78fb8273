/**
 * The QEMU-like legacy client of test/restart/legacy-client.py, in its own process: one connection,
 * a request, its reply, a pause, again, until done() closes its stdin; then its one JSON summary.
 * `inside` runs it in another PID namespace (RealSystemd.inside: QEMU shares the helper's); `pauseS`
 * is the pause between requests (default 0.002 s); `whole` writes each request in one write, as QEMU
 * does (else every third is split in two, 15 ms apart).
 */
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { expect } from 'vitest';

const SCRIPT = path.join(path.dirname(fileURLToPath(import.meta.url)), '../legacy-client.py');

export interface LegacyClientSummary {
  sent: number;
  answered: number;
  maxWaitMs: number;
  backwards: number;
  extraBytes: number;
  first: number | null;
  last: number | null;
  error: string | null;
}

/** A wait this long is a hang (a request lost in a handover or a crash), not a slow machine. */
const HANG_MS = 5000;

/**
 * The client's run went through whole: no error, every request answered once with no extra bytes,
 * the counter never back and moving, no wait as long as a hang.
 */
export function expectEveryRequestAnsweredOnce(s: LegacyClientSummary): void {
  expect(s.error).toBeNull();
  expect(s.answered).toBe(s.sent);
  expect(s.extraBytes).toBe(0);
  expect(s.backwards).toBe(0);
  expect(s.last!).toBeGreaterThan(s.first!);
  expect(s.maxWaitMs).toBeLessThan(HANG_MS);
}

export interface LegacyClientProcess {
  /** The client connected and sends. */
  ready: Promise<void>;
  /** The client process ended (its connection closed, or done()). */
  exited: Promise<void>;
  done(): Promise<LegacyClientSummary>;
}

export function legacyClientProcess(
  sock: string,
  o: { inside?: (argv: readonly string[]) => string[]; pauseS?: number; whole?: boolean } = {},
): LegacyClientProcess {
  const argv = [
    'python3',
    SCRIPT,
    sock,
    ...(o.pauseS !== undefined || o.whole ? [String(o.pauseS ?? 0.002)] : []),
    ...(o.whole ? ['whole'] : []),
  ];
  const [cmd, ...args] = o.inside ? o.inside(argv) : argv;
  const child = spawn(cmd!, args, { stdio: ['pipe', 'pipe', 'inherit'] });
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stdin.on('error', () => {});
  const ready = new Promise<void>((resolve, reject) => {
    const t = setInterval(() => out.startsWith('ready\n') && (clearInterval(t), resolve()), 5);
    child.once('exit', () => (clearInterval(t), reject(new Error(`client exited: ${out}`))));
  });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  return {
    ready,
    exited,
    async done() {
      child.stdin.end();
      await exited;
      return JSON.parse(out.split('\n').filter(Boolean).pop()!) as LegacyClientSummary;
    },
  };
}
