/**
 * The exporter's 32 connection slots were shared by everyone, and idle or
 * slow-header connections lived 27 to 31 s (Node checks its timeouts every 30 s): a local user
 * holding 32 of them blocked Prometheus (2 of 40 scrapes succeeded). Then, with the oldest idle
 * connection evicted for a new one, a hoarder reopening each connection it lost churned through all
 * 32 slots faster than a scrape sent its request on a busy machine (1 of 40 failed, ECONNRESET): the
 * slots are now shared by owner, the local uid at the other end. The hoarder is a real process of
 * uid nobody against the real exporter; the scraper is this process (root).
 */
import { spawn } from 'node:child_process';
import http from 'node:http';
import net from 'node:net';
import { describe, expect, test } from 'vitest';
import { HTTP_IDLE_TIMEOUT_MS, MAX_HTTP_CONNECTIONS } from '../../src/exporter/http-server.js';
import { waitFor } from '../support/wait.js';
import { missing } from '../support/env.js';
import { fakeHost, NOBODY, onCleanup, sleep, startExporterProcess } from './support.js';

/** Connections the hoarder keeps open: more than the slots, half idle, half sending headers slowly. */
const HOARDED = MAX_HTTP_CONNECTIONS + 8;
const SCRAPES = 40;
const SCRAPE_EVERY_MS = 100;
/** Timer slack on a loaded 2-core machine, for the timeout measurements. */
const SLACK_MS = 1_000;
/** Far above the timeout: what the test waits for a close (a loaded machine fires timers late). */
const CLOSE_DEADLINE_MS = 60_000;

/**
 * Keeps `n` connections to port open, reopening each one the exporter closes at once; odd ones send
 * one header byte every 300 ms and never finish. Prints "open N" whenever N connections are open.
 */
const HOARDER = `
const net = require('node:net');
const [port, n] = process.argv.slice(1).map(Number);
let open = 0;
function hold(i) {
  const s = net.connect(port, '127.0.0.1');
  let t;
  s.on('connect', () => {
    open++;
    process.stdout.write('open ' + open + '\\n');
    if (i % 2) { s.write('GET /metrics HTTP/1.1\\r\\n'); t = setInterval(() => s.write('X'), 300); }
  });
  s.on('error', () => {});
  s.on('close', (hadConnected) => { clearInterval(t); if (s.connecting === false) open--; setImmediate(() => hold(i)); });
}
for (let i = 0; i < n; i++) hold(i);
`;

/** One scrape on a connection of its own (no keep-alive pool); resolves with the status, or the error's code. */
function scrape(port: number): Promise<number | string> {
  return new Promise((resolve) => {
    const req = http.get({ host: '127.0.0.1', port, path: '/metrics', agent: false, timeout: 3_000 }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
      res.on('error', (e: NodeJS.ErrnoException) => resolve(e.code ?? e.message));
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', (e: NodeJS.ErrnoException) => resolve(e.code ?? e.message));
  });
}

/** Opens a connection, runs `use` on it, and resolves with the ms from `use`'s end until the exporter closed it. */
function closedAfter(port: number, use: (s: net.Socket) => Promise<void> | void): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.connect(port, '127.0.0.1');
    s.on('error', () => {});
    s.on('connect', async () => {
      let t0 = Date.now();
      await use(s);
      t0 = Date.now();
      s.on('close', () => resolve(Date.now() - t0));
      setTimeout(() => reject(new Error(`not closed within ${CLOSE_DEADLINE_MS / 1000} s`)), CLOSE_DEADLINE_MS).unref();
    });
  });
}

describe(`${HOARDED} hoarded connections`, () => {
  test(`every one of ${SCRAPES} scrapes succeeds while another user's process holds ${HOARDED} idle and slow-header connections`, async (ctx) => {
    // Another user: the slots are shared by user, and nobody is protected from itself.
    const why = missing({ root: true });
    if (why) return ctx.skip(why);
    const { sock } = fakeHost();
    const { child, port } = await startExporterProcess(sock, NOBODY);
    const hoarder = spawn(process.execPath, ['-e', HOARDER, String(port), String(HOARDED)], {
      stdio: ['ignore', 'pipe', 'inherit'],
      uid: NOBODY,
      gid: NOBODY,
    });
    onCleanup(() => void hoarder.kill('SIGKILL'));
    let out = '';
    hoarder.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    await waitFor(() => out.includes(`open ${HOARDED}\n`), `the hoarder to have opened ${HOARDED} connections`, child);
    const results: (number | string)[] = [];
    for (let i = 0; i < SCRAPES; i++) {
      results.push(await scrape(port));
      await sleep(SCRAPE_EVERY_MS);
    }
    expect(results.filter((r) => r !== 200)).toEqual([]);
    expect(child.proc.exitCode).toBeNull();
  }, 60_000);
});

describe('timeouts, measured', () => {
  test(
    `a connection that sends nothing, one that sends its headers byte by byte, and an idle keep-alive connection are closed once idle ${HTTP_IDLE_TIMEOUT_MS} ms after their last request ended, not before`,
    async () => {
      const { sock } = fakeHost();
      const { port } = await startExporterProcess(sock);
      const silent = closedAfter(port, () => {});
      const slow = closedAfter(port, (s) => {
        s.write('GET /metrics HTTP/1.1\r\n');
        const t = setInterval(() => s.write('X'), 200);
        s.on('close', () => clearInterval(t));
      });
      const keepAlive = closedAfter(
        port,
        (s) =>
          new Promise<void>((resolve) => {
            s.write('GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n');
            s.once('data', () => resolve());
          }),
      );
      const closed = await Promise.all([silent, slow, keepAlive]);
      console.log(`closed after ${closed.join(', ')} ms (the timeout: ${HTTP_IDLE_TIMEOUT_MS} ms)`);
      // Closed (the deadline above), and not before the timeout: how late a loaded machine's timer
      // fires is not what this checks.
      for (const ms of closed) expect(ms).toBeGreaterThan(HTTP_IDLE_TIMEOUT_MS - SLACK_MS);
    },
    CLOSE_DEADLINE_MS + 30_000,
  );
});
