/**
 * The command line. The root command is the daemon itself, with qemu-vmsr-helper's options, so the
 * helper drops in for QEMU's; the other jobs are subcommands, one module each.
 */
import { Command, CommanderError } from 'commander';
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
  return program;
}

/** Runs the CLI; a usage error exits 1 with commander's message, any other error prints it and exits 1. */
export async function main(argv: string[]): Promise<void> {
  const program = buildCli();
  program.exitOverride();
  try {
    await program.parseAsync(argv);
  } catch (e) {
    if (e instanceof CommanderError) {
      process.exitCode = e.exitCode;
      return;
    }
    const err = e as Error;
    process.stderr.write(`vmsr-helper: ${err.message}\n`);
    process.exitCode = 1;
  }
}
