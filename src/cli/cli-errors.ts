/**
 * UsageError: the command line is wrong (the message is followed by where its options are described).
 * ReportedError: already logged (the daemon's start-up failure), so the CLI only sets the exit status.
 */
export class UsageError extends Error {
  override name = 'UsageError';
}

export class ReportedError extends Error {
  override name = 'ReportedError';
}
