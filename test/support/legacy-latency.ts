/**
 * How long QEMU waits for the helper: a QEMU-like legacy connection sending a request every
 * `everyMs` (the next once the reply came) and timing each round trip, and the time a new
 * connection takes from connect() to its first reply. Used by the hostile tests and the bench.
 */
import net from 'node:net';
import { encodeLegacyRequest, LEGACY_REPLY_SIZE } from '../../src/protocol/legacy.js';

/** What the probes ask for: the package energy counter of CPU 0, for the probing process's own thread. */
const MSR_PKG_ENERGY_STATUS = 0x611;
const request = (): Buffer => encodeLegacyRequest({ msr: MSR_PKG_ENERGY_STATUS, cpu: 0, tid: process.pid });

/** One connection asking every `everyMs`; `waits` holds each round trip in ms. */
export class LegacyLatencyProbe {
  private readonly s: net.Socket;
  private sentAt = 0;
  private got = 0;
  private stopped = false;
  private timer: NodeJS.Timeout | undefined;
  readonly waits: number[] = [];
  error: string | null = null;

  private constructor(
    s: net.Socket,
    private readonly everyMs: number,
  ) {
    this.s = s;
    s.on('data', (d: Buffer) => {
      this.got += d.length;
      while (this.got >= LEGACY_REPLY_SIZE) {
        this.got -= LEGACY_REPLY_SIZE;
        this.waits.push(performance.now() - this.sentAt);
        if (!this.stopped) this.timer = setTimeout(() => this.send(), this.everyMs);
      }
    });
    s.on('error', (e) => (this.error ??= e.message));
    s.on('close', () => {
      if (!this.stopped) this.error ??= 'closed by the helper';
    });
  }

  /** Connects (waiting while the listen backlog is full, as QEMU does) and starts asking. */
  static async start(socketPath: string, everyMs = 10): Promise<LegacyLatencyProbe> {
    const s = await connectWaiting(socketPath, 10_000);
    const p = new LegacyLatencyProbe(s, everyMs);
    p.send();
    return p;
  }

  /** The round trip in flight, if its reply is late, counts too: a helper that stopped answering shows. */
  pendingMs(): number {
    return this.stopped || this.sentAt === 0 ? 0 : performance.now() - this.sentAt;
  }

  /** Drops what was measured so far (a warm-up). */
  reset(): void {
    this.waits.length = 0;
  }

  stop(): number[] {
    this.stopped = true;
    clearTimeout(this.timer);
    this.s.destroy();
    return this.waits;
  }

  private send(): void {
    if (this.stopped) return;
    this.sentAt = performance.now();
    this.s.write(request());
  }
}

/**
 * A new connection's wait: connect() (retried on EAGAIN, as QEMU's blocking connect waits while the
 * listen backlog is full), one request, its reply. Resolves with the ms from the first connect() to
 * the reply, or with Infinity when there is no reply within `limitMs`.
 */
export async function newConnectionWaitMs(socketPath: string, limitMs: number): Promise<number> {
  const t0 = performance.now();
  let s: net.Socket;
  try {
    s = await connectWaiting(socketPath, limitMs);
  } catch {
    return Infinity;
  }
  const r = await new Promise<'ok' | 'failed'>((resolve) => {
    const t = setTimeout(() => resolve('failed'), Math.max(0, limitMs - (performance.now() - t0)));
    s.write(request());
    s.once('data', () => {
      clearTimeout(t);
      resolve('ok');
    });
    s.once('close', () => {
      clearTimeout(t);
      resolve('failed');
    });
  });
  s.destroy();
  return r === 'ok' ? performance.now() - t0 : Infinity;
}

/**
 * A connection to `socketPath`: connect() retried on EAGAIN (the listen backlog is full), as QEMU's
 * blocking connect waits there; rejects on any other error, or when not connected within `limitMs`.
 */
export async function connectWaiting(socketPath: string, limitMs: number): Promise<net.Socket> {
  const end = performance.now() + limitMs;
  for (;;) {
    const s = net.connect(socketPath);
    const r = await new Promise<'ok' | 'again' | Error>((resolve) => {
      const t = setTimeout(
        () => resolve(new Error(`not connected to ${socketPath} within ${limitMs} ms`)),
        Math.max(0, end - performance.now()),
      );
      s.once('connect', () => {
        clearTimeout(t);
        resolve('ok');
      });
      s.once('error', (e: NodeJS.ErrnoException) => {
        clearTimeout(t);
        resolve(e.code === 'EAGAIN' ? 'again' : e);
      });
    });
    if (r === 'ok') return s;
    s.destroy();
    if (r !== 'again') throw r;
    if (performance.now() >= end) throw new Error(`not connected to ${socketPath} within ${limitMs} ms: the listen backlog stayed full`);
    await new Promise((res) => setTimeout(res, 1));
  }
}

/** The p-th percentile (0..100) of `xs`, nearest rank; NaN when empty. */
export function percentile(xs: readonly number[], p: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]!;
}
