/** The command line: the root command is the daemon, with qemu-vmsr-helper's options (a drop-in); the other jobs are subcommands. */
import { Command, CommanderError } from 'commander';
import { ReportedError, UsageError } from './cli-errors.js';
import { configureDaemonCommand } from './commands/start-daemon.js';
import { VERSION } from './version.js';
import { configureHelpLayout } from './help.js';

/** The subcommands, loaded only when the command line may need them: the daemon does not pay for their modules. */
const SUBCOMMANDS: Record<string, () => Promise<(program: Command) => void>> = {
  record: async () => (await import('./commands/record.js')).addRecordCommand,
  replay: async () => (await import('./commands/replay.js')).addReplayCommand,
  watch: async () => (await import('./commands/watch.js')).addWatchCommand,
  exporter: async () => (await import('./commands/exporter.js')).addExporterCommand,
  reload: async () => (await import('./commands/reload.js')).addReloadCommand,
  limit: async () => (await import('./commands/limit.js')).addLimitCommand,
  stats: async () => (await import('./commands/stats.js')).addStatsCommand,
  demo: async () => (await import('./commands/demo.js')).addDemoCommand,
  'hash-password': async () => (await import('./commands/hash-password.js')).addHashPasswordCommand,
};

/** True unless `args` surely runs the daemon; a false alarm (a user named "watch") only loads more. */
export function mayNeedSubcommands(args: readonly string[]): boolean {
  return args.some((a) => a in SUBCOMMANDS || a === 'help' || a === '-h' || a === '--help');
}

export async function buildCli(withSubcommands = true): Promise<Command> {
  const program = new Command('vmsr-helper');
  program.version(`vmsr-helper ${VERSION}`, '-V, --version', 'output version information and exit');
  program.helpOption('-h, --help', 'display this help and exit');
  program.showSuggestionAfterError(true);
  // Options after a subcommand are that subcommand's; values given before it reach it via commandOptions().
  program.enablePositionalOptions();
  configureDaemonCommand(program);
  if (withSubcommands) for (const load of Object.values(SUBCOMMANDS)) (await load())(program);
  rejectUnknownCommands(program);
  // The root has an action (the daemon), so commander adds no help command by itself.
  program.helpCommand('help [command]', 'display help for a command');
  for (const cmd of program.commands) cmd.version(`vmsr-helper ${VERSION}`, '-V, --version', 'output version information and exit');
  configureHelpLayout(program);
  // A usage error names the help of the command it belongs to: the root's for the daemon's options.
  for (const cmd of [program, ...program.commands]) cmd.showHelpAfterError(helpHint(commandPath(cmd)));
  return program;
}

/** A mistyped command (a stray operand of the root) refused as unknown, with a suggestion; set after the subcommands: not inherited. */
function rejectUnknownCommands(program: Command): void {
  program.allowExcessArguments(true);
  program.hook('preAction', (root, action) => {
    // commander's own refusal (suggestion included); public in commander's code, untyped in its .d.ts.
    if (action === root && root.args.length > 0) (root as unknown as { unknownCommand(): never }).unknownCommand();
  });
}

/** The hint after a usage error: `vmsr-helper record --help`, or the root's for the daemon. */
function helpHint(commandPath: string): string {
  return `(run '${commandPath} --help' for the options)`;
}

/** "vmsr-helper record" for record, "vmsr-helper" for the root. */
function commandPath(cmd: Command): string {
  const names: string[] = [];
  for (let c: Command | null = cmd; c; c = c.parent) names.unshift(c.name());
  return names.join(' ');
}

/** The exit status of a command whose output pipe closed: 128 + SIGPIPE, as a shell shows for `cat`. */
const CLOSED_PIPE_STATUS = 141;

/** Stdout closed (EPIPE: Node ignores SIGPIPE) ends a command quietly: one that runs until a signal as by SIGTERM, to clean up, others at once; returns whether it closed. */
function endQuietlyOnClosedStdout(): () => boolean {
  let closed = false;
  process.stdout.on('error', (err: NodeJS.ErrnoException) => {
    if (err.code !== 'EPIPE') {
      process.stderr.write(`vmsr-helper: cannot write the output: ${err.message}\n`);
      process.exit(1);
    }
    if (closed) return;
    closed = true;
    process.exitCode = CLOSED_PIPE_STATUS;
    if (process.listenerCount('SIGTERM') > 0) process.emit('SIGTERM', 'SIGPIPE');
    else process.exit(CLOSED_PIPE_STATUS);
  });
  return () => closed;
}

/** Runs the CLI; a usage error exits 1 with commander's message, any other error prints it and exits 1. */
export async function main(argv: string[]): Promise<void> {
  const closed = endQuietlyOnClosedStdout();
  try {
    await parseAndRun(argv);
  } finally {
    if (closed()) process.exitCode = CLOSED_PIPE_STATUS;
  }
}

async function parseAndRun(argv: string[], everyCommand = false): Promise<void> {
  const slim = !everyCommand && !mayNeedSubcommands(argv.slice(2));
  const program = await buildCli(!slim);
  program.exitOverride();
  for (const sub of program.commands) sub.exitOverride();
  // Which command's action failed, to name its --help under a UsageError.
  let running: Command = program;
  program.hook('preAction', (_root, action) => {
    running = action;
  });
  // Without the subcommands a mistyped one reads as a stray argument: held back, the line parsed again with all.
  let held = '';
  if (slim) program.configureOutput({ writeErr: (t) => void (held += t) });
  try {
    await program.parseAsync(argv);
  } catch (e) {
    if (e instanceof CommanderError) {
      if (slim && e.exitCode !== 0) return parseAndRun(argv, true);
      process.stderr.write(held);
      process.exitCode = e.exitCode;
      return;
    }
    process.exitCode = 1;
    if (e instanceof ReportedError) return;
    const err = e as Error;
    const where = commandPath(running);
    process.stderr.write(`${where}: ${err.message}\n`);
    if (e instanceof UsageError) process.stderr.write(`${helpHint(where)}\n`);
  }
}
