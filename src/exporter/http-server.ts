/**
 * The exporter's HTTP side (node:http): GET /metrics renders the book in the format the scraper
 * asks for; / names the metrics path; anything else is 404 (405 for other methods). Connection
 * slots with timers of their own (connection-slots.ts), so idle or slow clients cannot lock out the scraper.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { EnergyBook } from './energy-book.js';
import { buildExpositions, negotiateFormat } from './metrics.js';
import type { ListenAddress } from './listen-address.js';
import { cannot } from '../common/errors.js';
import { ConnectionSlots, type SlotStats } from './connection-slots.js';

export const METRICS_PATH = '/metrics';
/** Concurrent HTTP connections; Prometheus uses one per target. Full: the oldest idle one makes room. */
export const MAX_HTTP_CONNECTIONS = 32;
/** A connection without a request in progress (headers not yet whole, or idle after a response) lives this long. */
export const HTTP_IDLE_TIMEOUT_MS = 5_000;
/** A request must be answered and sent within this time of its headers. */
export const HTTP_REQUEST_TIMEOUT_MS = 10_000;

export interface MetricsServer {
  /** Where it listens (the real port when 0 was asked). */
  address: { host: string; port: number };
  /** Time the last /metrics render took, in seconds (for the bench and logs). */
  lastRenderS(): number | null;
  /** Connection slots: open, evicted, refused, timed out. */
  slots(): SlotStats;
  close(): Promise<void>;
}

export async function startMetricsServer(book: EnergyBook, listen: ListenAddress): Promise<MetricsServer> {
  const expositions = buildExpositions(book);
  let lastRender: number | null = null;
  // Node's own timeouts stay as a second line; ConnectionSlots enforces them per socket.
  const server = http.createServer(
    {
      requestTimeout: HTTP_REQUEST_TIMEOUT_MS,
      headersTimeout: HTTP_IDLE_TIMEOUT_MS,
      keepAliveTimeout: HTTP_IDLE_TIMEOUT_MS,
      connectionsCheckingInterval: 1_000,
    },
    (req, res) => {
      const url = (req.url ?? '/').split('?')[0];
      if (req.method !== 'GET' && req.method !== 'HEAD') {
        res.writeHead(405, { Allow: 'GET, HEAD', 'Content-Type': 'text/plain; charset=utf-8' }).end('method not allowed: use GET\n');
        return;
      }
      if (url === '/') {
        res.writeHead(200, { 'Content-Type': 'text/html; charset=utf-8' });
        res.end(
          `<html><head><title>vmsr-helper exporter</title></head><body><h1>vmsr-helper exporter</h1><p><a href="${METRICS_PATH}">Metrics</a></p></body></html>\n`,
        );
        return;
      }
      if (url !== METRICS_PATH) {
        res.writeHead(404, { 'Content-Type': 'text/plain; charset=utf-8' }).end(`not found: metrics are at ${METRICS_PATH}\n`);
        return;
      }
      const exposition = expositions[negotiateFormat(req.headers.accept)];
      const t0 = process.hrtime.bigint();
      book
        .scrape(() => exposition.render())
        .then((body) => {
          lastRender = Number(process.hrtime.bigint() - t0) / 1e9;
          res.writeHead(200, { 'Content-Type': exposition.contentType, 'Content-Length': Buffer.byteLength(body) });
          res.end(req.method === 'HEAD' ? undefined : body);
        })
        .catch((e: Error) => {
          res.writeHead(500, { 'Content-Type': 'text/plain; charset=utf-8' }).end(`${cannot(`render metrics`, e.message)}\n`);
        });
    },
  );
  // Not server.maxConnections: Node then refuses every new connection while the slots are full.
  const slots = new ConnectionSlots(server, {
    max: MAX_HTTP_CONNECTIONS,
    idleMs: HTTP_IDLE_TIMEOUT_MS,
    requestMs: HTTP_REQUEST_TIMEOUT_MS,
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', (e: NodeJS.ErrnoException) => {
      const fix =
        e.code === 'EADDRINUSE'
          ? 'another process uses that port; pick another with --listen HOST:PORT'
          : e.code === 'EACCES'
            ? 'ports below 1024 need privileges the exporter should not have; pick a port >= 1024'
            : e.code === 'EADDRNOTAVAIL'
              ? 'no interface has that address; use 127.0.0.1 or an address of this host'
              : 'check --listen';
      reject(new Error(cannot(`listen on ${listen.host}:${listen.port}`, e.code ?? e.message, fix)));
    });
    server.listen(listen.port, listen.host, () => resolve());
  });
  const a = server.address() as AddressInfo;
  return {
    address: { host: a.address, port: a.port },
    lastRenderS: () => lastRender,
    slots: () => slots.stats(),
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
