/** `vmsr-helper exporter`: runs until SIGINT/SIGTERM; SIGHUP is logged (os/sighup.ts). */
import { Option, type Command } from 'commander';
import { V2Client } from '../../client/v2-client.js';
import { startExporter } from '../../exporter/exporter-process.js';
import { DEFAULT_BOOK_LIMITS } from '../../exporter/energy-book.js';
import { DEFAULT_LISTEN, parseListenAddress, type ListenAddress } from '../../exporter/listen-address.js';
import { DEFAULT_HOST_SERIES, HOST_SERIES_CHOICES, type HostSeries } from '../../exporter/host-series.js';
import { addClientSocketOption, addLogLevelOptions, commandOptions, listenAddressArg, metricsPathArg, wholeNumberArg } from '../options.js';
import { DEFAULT_METRICS_PATH } from '../../exporter/metrics-path.js';
import { createLogger, levelFromFlags } from '../../logging/logger.js';
import { DisposableStore } from '../../common/disposable.js';
import { onStopSignals } from '../stop-signals.js';
import { DEFAULT_HELPER_SOCKET } from '../../protocol/socket-path.js';
import { MAX_VMS } from '../../model/vm.js';
import { handleSighup } from '../../os/sighup.js';
import { closeOpenInspector } from '../../os/inspector-guard.js';

export function addExporterCommand(program: Command): void {
  const exporter = addClientSocketOption(
    program
      .command('exporter')
      .description(
        "serve every VM's energy and power, the host packages and the helper's health as Prometheus / OpenMetrics metrics over HTTP",
      ),
  )
    // node_exporter's flag names beside ours: one option with two names (commander's two long flags).
    .option(
      '--web.listen-address, --listen <[host]:port>',
      `where to serve the metrics: HOST:PORT, [IPv6]:PORT, or :PORT for every address (default ${DEFAULT_LISTEN}: loopback only)`,
      listenAddressArg,
    )
    .option('--web.telemetry-path <path>', `the URL path of the metrics (default ${DEFAULT_METRICS_PATH})`, metricsPathArg)
    .option(
      '--web.config.file <file>',
      'TLS, basic authentication and response headers, in the web configuration file format Prometheus exporters share (docs/exporter.md); read again when it changes',
    )
    .addOption(
      new Option('--host-series <who>', `who may read the host packages' energy series (docs/security.md)`)
        .choices(HOST_SERIES_CHOICES)
        .default(DEFAULT_HOST_SERIES),
    )
    .option(
      '--max-vms <n>',
      `export at most N VMs; more are skipped and logged (default ${DEFAULT_BOOK_LIMITS.maxExportedVms})`,
      wholeNumberArg('--max-vms', MAX_VMS),
    );
  addLogLevelOptions(exporter).action(async (_o: unknown, cmd: Command) => {
    // -k, -v and -q mean the same before the subcommand (the daemon's parser may take them);
    // --max-vms is read from this command only: the daemon's own --max-vms (a default) is another limit.
    const o = commandOptions<{
      socket?: string;
      verbose?: boolean;
      quiet?: boolean;
      listen?: ListenAddress;
      maxVms?: number;
      'web.config.file'?: string;
      'web.telemetryPath'?: string;
      hostSeries?: HostSeries;
    }>(cmd);
    const socketPath = o.socket ?? DEFAULT_HELPER_SOCKET;
    const log = createLogger(levelFromFlags(o), 'vmsr-helper-exporter');
    const exporter = await startExporter(
      {
        socketPath,
        listen: o.listen ?? parseListenAddress(DEFAULT_LISTEN),
        maxExportedVms: o.maxVms ?? DEFAULT_BOOK_LIMITS.maxExportedVms,
        webConfigFile: o['web.config.file'] ?? null,
        hostSeries: o.hostSeries ?? DEFAULT_HOST_SERIES,
        metricsPath: o['web.telemetryPath'] ?? DEFAULT_METRICS_PATH,
      },
      () => V2Client.connect(socketPath),
      log,
    );
    const signals = new DisposableStore();
    signals.add(handleSighup(log));
    const inspectorUrl = closeOpenInspector();
    if (inspectorUrl !== null)
      log.warn({ inspector: inspectorUrl }, "Node's inspector was open: closed (a debugger must not reach the exporter)");
    await new Promise<void>((resolve) => signals.add(onStopSignals(() => resolve())));
    signals.dispose();
    log.info('stopping');
    await exporter.stop();
  });
}
