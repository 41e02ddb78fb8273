/** The command line is wrong: the message is followed by where its options are described. */
export class UsageError extends Error {
  override name = 'UsageError';
}

/** Already logged (the daemon's start-up failure): the CLI only sets the exit status. */
export class ReportedError extends Error {
  override name = 'ReportedError';
}
