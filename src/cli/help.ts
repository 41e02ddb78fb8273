/** THE examples of the commands, and the layout of `--help` (the commands first, then the daemon's options). */
import { Help, type Command } from 'commander';

/** One example per command, as a user types it on an installed host. */
export const COMMAND_EXAMPLES: Readonly<Record<string, string>> = {
  record: 'vmsr-helper record --vm web01 -o host.jsonl.gz',
  replay: 'vmsr-helper replay',
  watch: 'vmsr-helper watch web01',
  exporter: 'vmsr-helper exporter --web.listen-address 127.0.0.1:8677',
  reload: 'vmsr-helper reload',
  limit: 'vmsr-helper limit web01 35',
  stats: 'vmsr-helper stats --once',
  demo: 'vmsr-helper demo',
  'hash-password': 'vmsr-helper hash-password < password.txt',
  help: 'vmsr-helper help exporter',
};

/** The daemon's example: what the root command does without a command. */
export const DAEMON_EXAMPLE = 'vmsr-helper -k /run/qemu-vmsr-helper.sock -u libvirt-qemu -g kvm';

/** The example of a command, or undefined for one without (a command added without its example). */
export function exampleOf(cmd: Command): string | undefined {
  // commander's own help command has no parent: its name tells it from the root.
  return cmd.name() in COMMAND_EXAMPLES ? COMMAND_EXAMPLES[cmd.name()] : cmd.parent === null ? DAEMON_EXAMPLE : undefined;
}

/** Sets the layout: call once every command exists (commander copies help settings only into later commands). */
export function configureHelpLayout(program: Command): void {
  for (const cmd of program.commands) {
    const example = exampleOf(cmd);
    if (example !== undefined) cmd.addHelpText('after', `\nExample:\n  ${example}\n`);
  }
  program.addHelpText('after', `\nThe daemon, as QEMU's hosts start it:\n  ${DAEMON_EXAMPLE}\n`);
  const base = new Help();
  program.configureHelp({
    subcommandDescription: (sub) => {
      const example = exampleOf(sub);
      return example === undefined ? sub.description() : `${sub.description()}\ne.g. ${example}`;
    },
    // commander puts the commands last; a newcomer looks for them first.
    formatHelp: (cmd, helper) => {
      const text = base.formatHelp.call(helper, cmd, helper);
      const commands = text.indexOf('\nCommands:\n');
      const options = text.indexOf('\nOptions:\n');
      if (commands < 0 || options < 0 || options > commands) return text;
      const optionsBlock = text
        .slice(options + 1, commands + 1)
        .replace(/^Options:$/m, 'Options of the daemon (vmsr-helper without a command):');
      return text.slice(0, options + 1) + text.slice(commands + 1) + '\n' + optionsBlock;
    },
  });
}
