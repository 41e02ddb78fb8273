/** The keeper's image (docs/daemon.md "Crashes"): loads only the keeper, the logger and -d's report (docs/performance.md "Memory"). */
import { takeKeeperImage, type KeeperImage } from '../keeper/keeper-messages.js';
import { runKeeper } from '../keeper/keeper.js';
import { savedUidRoot } from '../os/privileges/capabilities.js';
import { createLogger, type LogLevel } from '../logging/logger.js';
import { DAEMON_CHILD_ENV, isDaemonChild, reportReady } from '../helper/lifecycle/daemonize.js';

export async function runKeeperImage(): Promise<never> {
  // Before anything else: from here on no process of -u's user may signal the keeper.
  savedUidRoot();
  const image: KeeperImage = takeKeeperImage()!;
  const log = createLogger(image.level as LogLevel).child({ area: 'keeper' });
  const env: NodeJS.ProcessEnv = { ...process.env, ...image.env };
  delete env[DAEMON_CHILD_ENV];
  log.info({}, 'keeper: holding the socket and the connections; starting the serving process');
  const code = await runKeeper({ ...image, env, log, ...(isDaemonChild() ? { onReady: reportReady } : {}) });
  process.exit(code);
}
