/** The bash completion, made at build time (bin/make-docs.ts) from buildCli()'s definitions: commands, options, choices. */
import type { Command, Option } from 'commander';

/** Every spelling of an option: its short and long flags (commander keeps a second long flag as `short`). */
function flagsOf(o: Option): string[] {
  return [o.short, o.long].filter((f): f is string => f !== undefined);
}

function optionWords(cmd: Command): string {
  return cmd
    .createHelp()
    .visibleOptions(cmd)
    .flatMap(flagsOf)
    .filter((f) => f.startsWith('--'))
    .join(' ');
}

/** `case` arms that complete the value of an option with choices. */
function choiceArms(cmds: readonly Command[]): string[] {
  const arms = new Map<string, string>();
  for (const cmd of cmds) for (const o of cmd.options) if (o.argChoices) for (const f of flagsOf(o)) arms.set(f, o.argChoices.join(' '));
  return [...arms].map(([flag, words]) => `    ${flag}) COMPREPLY=($(compgen -W "${words}" -- "$cur")); return ;;`);
}

export function renderBashCompletion(program: Command): string {
  const commands = program.commands.filter((c) => !(c as unknown as { _hidden: boolean })._hidden);
  const names = [...commands.map((c) => c.name()), 'help'];
  return `# bash completion for vmsr-helper: its commands, their options and the choices of options.
# Generated from the program's own option definitions (src/cli/completion.ts); do not edit.
_vmsr_helper() {
  local cur prev cmd i
  cur="\${COMP_WORDS[COMP_CWORD]}"
  prev="\${COMP_WORDS[COMP_CWORD-1]}"
  case "$prev" in
${choiceArms([program, ...commands]).join('\n')}
  esac
  cmd=""
  for ((i = 1; i < COMP_CWORD; i++)); do
    case "\${COMP_WORDS[i]}" in
      ${names.join('|')}) cmd="\${COMP_WORDS[i]}"; break ;;
    esac
  done
  local opts
  case "$cmd" in
${commands.map((c) => `    ${c.name()}) opts="${optionWords(c)}" ;;`).join('\n')}
    help) COMPREPLY=($(compgen -W "${names.join(' ')}" -- "$cur")); return ;;
    *) opts="${optionWords(program)}" ;;
  esac
  if [[ "$cur" == -* ]]; then
    COMPREPLY=($(compgen -W "$opts" -- "$cur"))
  elif [[ -z "$cmd" && "$prev" != -* ]]; then
    COMPREPLY=($(compgen -W "${names.join(' ')}" -- "$cur"))
  else
    COMPREPLY=($(compgen -f -- "$cur"))
  fi
}
complete -o filenames -F _vmsr_helper vmsr-helper
`;
}
