/**
 * THE metrics path: its default and the check of --web.telemetry-path (node_exporter's flag name).
 * Small on purpose: the CLI's option parsers import it without the HTTP server.
 */
import { cannotError } from '../common/errors.js';

/** Where the metrics are served unless --web.telemetry-path says otherwise (node_exporter's default too). */
export const DEFAULT_METRICS_PATH = '/metrics';
/** The longest --web.telemetry-path. */
const MAX_METRICS_PATH = 256;

/** --web.telemetry-path checked: an absolute URL path, not the root page, printable ASCII without spaces, '?' or '#'. */
export function checkMetricsPath(text: string): string {
  if (!/^\/[!-~]+$/.test(text) || /[?#]/.test(text) || text.length > MAX_METRICS_PATH)
    throw cannotError(
      `use ${JSON.stringify(text.slice(0, MAX_METRICS_PATH))} as the metrics path`,
      `it must start with '/', name more than the root page, and hold at most ${MAX_METRICS_PATH} printable characters without spaces, '?' or '#'`,
      `give a path such as ${DEFAULT_METRICS_PATH}`,
    );
  return text;
}
