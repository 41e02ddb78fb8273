/**
 * The command line. The root command is the daemon itself, with qemu-vmsr-helper's options, so the
 * helper drops in for QEMU's; the other jobs are subcommands, one module each.
 */
import { Command, CommanderError } from 'commander';
import { helpHint, ReportedError, UsageError } from './cli-errors.js';
import { configureDaemonCommand } from './commands/daemon.js';
import { addRecordCommand } from './commands/record.js';
import { addReplayCommand } from './commands/replay.js';
import { addWatchCommand } from './commands/watch.js';
import { VERSION } from './version.js';

export function buildCli(): Command {
  const program = new Command('vmsr-helper');
  program.version(`vmsr-helper ${VERSION}`, '-V, --version', 'output version information and exit');
  program.helpOption('-h, --help', 'display this help and exit');
  program.showSuggestionAfterError(true);
  // Options after a subcommand are that subcommand's: `record --interval 0.5` is record's interval,
  // parsed by record, not the daemon's. Values given before the subcommand still reach it via
  // optsWithGlobals().
  program.enablePositionalOptions();
  configureDaemonCommand(program);
  addRecordCommand(program);
  addReplayCommand(program);
  addWatchCommand(program);
  // `vmsr-helper help [command]`: the root command has an action (it is the daemon), so commander
  // adds no help command by itself and would read "help" as a stray argument.
  program.helpCommand('help [command]', 'display help for a command');
  // A usage error names the help of the command it belongs to: the root's for the daemon's options.
  for (const cmd of [program, ...program.commands]) cmd.showHelpAfterError(helpHint(commandPath(cmd)));
  return program;
}

/** "vmsr-helper record" for record, "vmsr-helper" for the root. */
export function commandPath(cmd: Command): string {
  const names: string[] = [];
  for (let c: Command | null = cmd; c; c = c.parent) names.unshift(c.name());
  return names.join(' ');
}

/** Runs the CLI; a usage error exits 1 with commander's message, any other error prints it and exits 1. */
export async function main(argv: string[]): Promise<void> {
  const program = buildCli();
  program.exitOverride();
  for (const sub of program.commands) sub.exitOverride();
  // Which command's action failed, to name its --help under a UsageError.
  let running: Command = program;
  program.hook('preAction', (_root, action) => {
    running = action;
  });
  try {
    await program.parseAsync(argv);
  } catch (e) {
    if (e instanceof CommanderError) {
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
