import type { Command } from 'commander';

// Placeholder until the daemon lands.
export function configureDaemonCommand(program: Command): void {
  program.description('Virtual RAPL MSR helper for QEMU (drop-in qemu-vmsr-helper)').action(() => {
    throw new Error('the daemon is not built yet');
  });
}
