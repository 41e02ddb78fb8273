/**
 * The exporter's HTTP side (docs/exporter.md "HTTP"). A request is authenticated by a right password
 * or a verified client certificate; --host-series (host-series.ts) decides what an unauthenticated one sees.
 */
import http from 'node:http';
import net, { type AddressInfo } from 'node:net';
import tls from 'node:tls';
import type { EnergyBook } from './energy-book.js';
import { buildExpositions, negotiateFormat } from './metrics.js';
import { formatListenAddress, type ListenAddress } from './listen-address.js';
import { cannot, cannotError } from '../common/errors.js';
import { ConnectionSlots } from './connection-slots.js';
import { ConnectionOwners } from './connection-owner.js';
import type { LoadedWebConfig, WebConfigFile } from './web-config-file.js';
import type { TlsServerConfig } from './web-config.js';
import { BasicAuth, WWW_AUTHENTICATE } from './basic-auth.js';
import { DEFAULT_HOST_SERIES, showsHostSeries, type HostSeries } from './host-series.js';
import { DEFAULT_METRICS_PATH } from './metrics-path.js';
import { sourceOf } from './auth-failures.js';

/** Concurrent HTTP connections; Prometheus uses one per target. Full: the oldest idle one makes room. */
export const MAX_HTTP_CONNECTIONS = 32;
/** A connection without a request in progress (headers not yet whole, or idle after a response) lives this long. */
export const HTTP_IDLE_TIMEOUT_MS = 5_000;
/** A request must be answered and sent within this time of its headers. */
const HTTP_REQUEST_TIMEOUT_MS = 10_000;

export type MetricsServer = Awaited<ReturnType<typeof startMetricsServer>>;

interface MetricsServerOptions {
  /** The --web.config.file, or null for plain HTTP without authentication. */
  web?: WebConfigFile | null;
  hostSeries?: HostSeries;
  /** Where the metrics are (checkMetricsPath), DEFAULT_METRICS_PATH by default. */
  metricsPath?: string;
}

/** Whether a client's certificate meets the policy beyond what OpenSSL checked (presence, SANs). */
function clientCertAllowed(t: TlsServerConfig, socket: tls.TLSSocket): boolean {
  const cert = socket.getPeerCertificate();
  const has = cert !== null && typeof cert === 'object' && Object.keys(cert).length > 0;
  if (t.clientAuthType === 'RequireAnyClientCert' && !has) return false;
  if (t.clientAuthType === 'VerifyClientCertIfGiven' && has && !socket.authorized) return false;
  if (t.clientAllowedSans.length > 0) {
    // Node writes the SANs as "DNS:a, IP Address:1.2.3.4, email:x@y, URI:u".
    const sans = (has ? (cert.subjectaltname ?? '') : '').split(', ').map((e) => e.slice(e.indexOf(':') + 1));
    if (!t.clientAllowedSans.some((a) => sans.includes(a))) return false;
  }
  return true;
}

const TEXT = 'text/plain; charset=utf-8';

/** Answers one request: / and the metrics path (what the view shows), 404 and 405 otherwise. */
function serveRequest(book: EnergyBook, opts: MetricsServerOptions) {
  const expositions = buildExpositions(book);
  const hostSeries = opts.hostSeries ?? DEFAULT_HOST_SERIES;
  const metricsPath = opts.metricsPath ?? DEFAULT_METRICS_PATH;
  return (req: http.IncomingMessage, res: http.ServerResponse, byPassword: boolean): void => {
    const byCert = req.socket instanceof tls.TLSSocket && req.socket.authorized;
    const url = (req.url ?? '/').split('?')[0];
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.writeHead(405, { Allow: 'GET, HEAD', 'Content-Type': TEXT }).end('method not allowed: use GET\n');
      return;
    }
    if (url === '/') {
      res.writeHead(200, { 'Content-Type': 'text/html; charset=utf-8' });
      res.end(
        `<html><head><title>vmsr-helper exporter</title></head><body><h1>vmsr-helper exporter</h1><p><a href="${metricsPath}">Metrics</a></p></body></html>\n`,
      );
      return;
    }
    if (url !== metricsPath) {
      res.writeHead(404, { 'Content-Type': TEXT }).end(`not found: metrics are at ${metricsPath}\n`);
      return;
    }
    const view = showsHostSeries(hostSeries, byPassword || byCert) ? expositions.withHost : expositions.withoutHost;
    const exposition = view[negotiateFormat(req.headers.accept)];
    book
      .scrape(() => exposition.render())
      .then((body) => {
        res.writeHead(200, { 'Content-Type': exposition.contentType, 'Content-Length': Buffer.byteLength(body) });
        res.end(req.method === 'HEAD' ? undefined : body);
      })
      .catch((e: Error) => {
        res.writeHead(500, { 'Content-Type': TEXT }).end(`${cannot(`render metrics`, e.message)}\n`);
      });
  };
}

/**
 * The request listener: the file's headers, then basic authentication when it has users. A source past its failed
 * checks gets 429 on a kept-alive connection (closing costs both a TLS handshake, the exporter the dearer half);
 * a refused connection is the first evicted.
 */
function requestListener(
  web: WebConfigFile | null,
  auth: BasicAuth,
  serve: ReturnType<typeof serveRequest>,
  refused: (socket: net.Socket) => void,
): http.RequestListener {
  return (req, res) => {
    // Closed by the connection slots (a pipelined request): nothing to serve.
    if (req.socket.destroyed) return;
    const config = web?.current().config ?? null;
    if (config !== null) for (const [name, value] of Object.entries(config.headers)) res.setHeader(name, value);
    if (config === null || config.basicAuthUsers.size === 0) {
      serve(req, res, false);
      return;
    }
    auth
      .verdict(config.basicAuthUsers, req.headers.authorization, sourceOf(req.socket.remoteAddress))
      .then((v) => {
        if (v === 'ok') {
          serve(req, res, true);
          return;
        }
        refused(req.socket);
        if (v === 'limited')
          res
            .writeHead(429, { 'Retry-After': '1', 'Content-Type': TEXT })
            .end('too many failed password checks from your address: try again later\n');
        else res.writeHead(401, { 'WWW-Authenticate': WWW_AUTHENTICATE, 'Content-Type': TEXT }).end('Unauthorized\n');
      })
      .catch((e: Error) => {
        res.writeHead(500, { 'Content-Type': TEXT }).end(`${cannot('check the password', e.message)}\n`);
      });
  };
}

/**
 * With TLS, a TCP server of our own hands each connection to a TLS server (never listening) made from the file as it is
 * then: a renewed certificate or client policy applies from the next connection. Node's TLS server verifies client
 * certificates and times the handshake; the rest of Go's policies is checked after it; then HTTP takes the socket.
 */
function tlsFront(web: WebConfigFile, server: http.Server): net.Server {
  const tlsServers = new WeakMap<LoadedWebConfig, tls.Server>();
  const tlsServerFor = (loaded: LoadedWebConfig): tls.Server | null => {
    const t = loaded.config.tls;
    if (t === null || loaded.tlsOptions === null) return null;
    let s = tlsServers.get(loaded);
    if (s === undefined) {
      s = tls.createServer({ ...loaded.tlsOptions, ALPNProtocols: ['http/1.1'], handshakeTimeout: HTTP_IDLE_TIMEOUT_MS });
      s.on('secureConnection', (socket: tls.TLSSocket) => {
        if (clientCertAllowed(t, socket)) server.emit('connection', socket);
        else socket.destroy();
      });
      s.on('tlsClientError', (_e, socket: tls.TLSSocket) => socket.destroy());
      tlsServers.set(loaded, s);
    }
    return s;
  };
  return net.createServer((raw) => {
    const s = tlsServerFor(web.current());
    if (s === null) raw.destroy();
    else s.emit('connection', raw);
  });
}

const LISTEN_FIXES: Partial<Record<string, string>> = {
  EADDRINUSE: 'another process uses that port; pick another with --listen [HOST]:PORT',
  EACCES: 'ports below 1024 need privileges the exporter should not have; pick a port >= 1024',
  EADDRNOTAVAIL: 'no interface has that address; use 127.0.0.1 or an address of this host',
};

/** Listens on `listen`; a failure names the fix. */
function listenOn(front: net.Server, listen: ListenAddress): Promise<void> {
  const where = formatListenAddress(listen);
  return new Promise<void>((resolve, reject) => {
    front.once('error', (e: NodeJS.ErrnoException) => {
      reject(cannotError(`listen on ${where}`, e.code ?? e.message, LISTEN_FIXES[e.code ?? ''] ?? 'check --listen'));
    });
    // No host (":PORT"): every address, IPv6 and IPv4.
    front.listen(listen.port, listen.host ?? undefined, () => resolve());
  });
}

export async function startMetricsServer(book: EnergyBook, listen: ListenAddress, opts: MetricsServerOptions = {}) {
  const web = opts.web ?? null;
  const serve = serveRequest(book, opts);
  // Node's own timeouts stay as a second line; ConnectionSlots enforces them per socket.
  const server = http.createServer(
    {
      requestTimeout: HTTP_REQUEST_TIMEOUT_MS,
      headersTimeout: HTTP_IDLE_TIMEOUT_MS,
      keepAliveTimeout: HTTP_IDLE_TIMEOUT_MS,
      connectionsCheckingInterval: 1_000,
    },
    requestListener(web, new BasicAuth(), serve, (socket) => slots.markRefused(socket)),
  );
  // Not server.maxConnections: Node then refuses every new connection while the slots are full.
  const owners = new ConnectionOwners();
  const slots: ConnectionSlots = new ConnectionSlots(
    server,
    { max: MAX_HTTP_CONNECTIONS, idleMs: HTTP_IDLE_TIMEOUT_MS, requestMs: HTTP_REQUEST_TIMEOUT_MS },
    owners.ownerOf,
  );
  const withTls = web !== null && web.current().tlsOptions !== null;
  const front: net.Server = withTls ? tlsFront(web, server) : server;
  await listenOn(front, listen);
  const a = front.address() as AddressInfo;
  return {
    address: { host: a.address, port: a.port },
    close: () =>
      new Promise<void>((resolve) => {
        if (front !== server) front.close();
        server.close(() => {
          owners.close();
          resolve();
        });
        server.closeAllConnections();
      }),
  };
}
