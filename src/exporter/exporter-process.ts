/**
 * The exporter process: one EnergyBook fed by an ObserverSession (a v2 client of the daemon), rendered by the metrics HTTP
 * server. Unprivileged: it only connects to the helper's socket (its group) and binds its port.
 */
import type { Logger } from 'pino';
import { DEFAULT_BOOK_LIMITS, EnergyBook } from './energy-book.js';
import { startMetricsServer } from './http-server.js';
import { DEFAULT_METRICS_PATH } from './metrics-path.js';
import { formatListenAddress, type ListenAddress } from './listen-address.js';
import { ObserverSession, type Backoff, type ObserverClient } from './observer-session.js';
import { WebConfigFile } from './web-config-file.js';
import { requiresAuthentication } from './web-config.js';
import { DEFAULT_HOST_SERIES, type HostSeries } from './host-series.js';
import { checkBcryptAvailable } from '../os/bcrypt.js';

interface ExporterConfig {
  socketPath: string;
  listen: ListenAddress;
  maxExportedVms: number;
  backoff?: Backoff;
  /** --web.config.file: TLS, basic authentication, headers (docs/exporter.md "Web configuration file"). */
  webConfigFile?: string | null;
  hostSeries?: HostSeries;
  /** --web.telemetry-path (checked by checkMetricsPath); DEFAULT_METRICS_PATH by default. */
  metricsPath?: string;
}

export async function startExporter(c: ExporterConfig, connect: () => Promise<ObserverClient>, log: Logger) {
  if (process.getuid?.() === 0)
    log.warn(
      "the exporter runs as root; it needs no privileges: run it as a user in the helper socket's group (see contrib/systemd/vmsr-helper-exporter.service)",
    );
  const web = c.webConfigFile ? new WebConfigFile(c.webConfigFile, log) : null;
  const config = web?.current().config ?? null;
  if (config !== null && config.basicAuthUsers.size > 0) checkBcryptAvailable();
  const hostSeries = c.hostSeries ?? DEFAULT_HOST_SERIES;
  if (hostSeries === 'authenticated' && (config === null || !requiresAuthentication(config)))
    log.warn(
      { hostSeries },
      '--host-series authenticated without basic_auth_users or a verified client certificate in --web.config.file: no reader sees the host package series',
    );
  const book = new EnergyBook({ ...DEFAULT_BOOK_LIMITS, maxExportedVms: c.maxExportedVms });
  const metricsPath = c.metricsPath ?? DEFAULT_METRICS_PATH;
  const server = await startMetricsServer(book, c.listen, { web, hostSeries, metricsPath });
  const url = `${config?.tls ? 'https' : 'http'}://${formatListenAddress(server.address)}${metricsPath}`;
  log.info(
    { url, socket: c.socketPath, tls: config?.tls != null, basicAuth: (config?.basicAuthUsers.size ?? 0) > 0, hostSeries },
    `Serving metrics on ${url}`,
  );
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
