/**
 * The exporter process: one EnergyBook fed by an ObserverSession (v2 client of the helper daemon),
 * rendered by the metrics HTTP server. Unprivileged by design: it only needs to connect to the
 * helper's socket (its group) and to bind its port.
 */
import type { Logger } from 'pino';
import { DEFAULT_BOOK_LIMITS, EnergyBook } from './energy-book.js';
import { startMetricsServer, METRICS_PATH } from './http-server.js';
import type { ListenAddress } from './listen-address.js';
import type { ObserverClient } from './observer-api.js';
import { ObserverSession, type Backoff } from './observer-session.js';

export interface ExporterConfig {
  socketPath: string;
  listen: ListenAddress;
  maxExportedVms: number;
  backoff?: Backoff;
}

export interface RunningExporter {
  url: string;
  book: EnergyBook;
  stop(): Promise<void>;
}

export async function startExporter(c: ExporterConfig, connect: () => Promise<ObserverClient>, log: Logger): Promise<RunningExporter> {
  if (process.getuid?.() === 0)
    log.warn(
      "the exporter runs as root; it needs no privileges: run it as a user in the helper socket's group (see contrib/systemd/vmsr-helper-exporter.service)",
    );
  const book = new EnergyBook({ ...DEFAULT_BOOK_LIMITS, maxExportedVms: c.maxExportedVms });
  const server = await startMetricsServer(book, c.listen);
  const host = server.address.host.includes(':') ? `[${server.address.host}]` : server.address.host;
  const url = `http://${host}:${server.address.port}${METRICS_PATH}`;
  log.info({ url, socket: c.socketPath }, `Serving metrics on ${url}`);
  const session = new ObserverSession({ connect, book, log, backoff: c.backoff, socketPath: c.socketPath });
  return {
    url,
    book,
    async stop() {
      await session.stop();
      await server.close();
    },
  };
}
