/**
 * Errors the CLI treats specially. UsageError: the command line itself is wrong; the message is
 * followed by where that command's options are described. ReportedError: already logged (the daemon
 * logs its start-up failure in its log format), so the CLI only sets the exit status.
 */
export class UsageError extends Error {
  override name = 'UsageError';
}

export class ReportedError extends Error {
  override name = 'ReportedError';
}

/** The hint after a usage error: `vmsr-helper record --help`, or the root's for the daemon. */
export function helpHint(commandPath: string): string {
  return `(run '${commandPath} --help' for the options)`;
}
