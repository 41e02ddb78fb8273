import type { Command } from 'commander';

// Placeholder until the watch command lands; it says so instead of pretending.
export function addWatchCommand(program: Command): void {
  program
    .command('watch')
    .description('(not built yet)')
    .allowUnknownOption()
    .action(() => {
      throw new Error('the watch command is not built yet');
    });
}
