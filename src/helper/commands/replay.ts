import type { Command } from 'commander';

// Placeholder until the replay command lands; it says so instead of pretending.
export function addReplayCommand(program: Command): void {
  program
    .command('replay')
    .description('(not built yet)')
    .allowUnknownOption()
    .action(() => {
      throw new Error('the replay command is not built yet');
    });
}
