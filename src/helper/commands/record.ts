import type { Command } from 'commander';

// Placeholder until the record command lands; it says so instead of pretending.
export function addRecordCommand(program: Command): void {
  program
    .command('record')
    .description('(not built yet)')
    .allowUnknownOption()
    .action(() => {
      throw new Error('the record command is not built yet');
    });
}
