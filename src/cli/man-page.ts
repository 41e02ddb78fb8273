/** The man page vmsr-helper(1), made at build time (bin/make-docs.ts) from buildCli()'s definitions, so it cannot drift from `--help`. */
import type { Command, Option } from 'commander';
import { exampleOf } from './help.js';

/** Text for roff: backslashes escaped, dashes as \-, and a line that starts with . or ' kept literal. */
function roff(text: string): string {
  return text
    .replace(/\\/g, '\\e')
    .replace(/-/g, '\\-')
    .split('\n')
    .map((l) => (/^[.']/.test(l) ? `\\&${l}` : l))
    .join('\n');
}

function optionItem(o: Option): string {
  const parts = [o.description];
  if (o.argChoices) parts.push(`(choices: ${o.argChoices.join(', ')})`);
  if (o.defaultValue !== undefined && o.defaultValueDescription === undefined && typeof o.defaultValue !== 'object')
    parts.push(`(default: ${String(o.defaultValue)})`);
  return `.TP\n.B ${roff(o.flags)}\n${roff(parts.join(' '))}`;
}

function commandSection(cmd: Command): string {
  const help = cmd.createHelp();
  const lines = [`.SS "${roff(help.commandUsage(cmd))}"`];
  lines.push(roff(cmd.description()));
  for (const a of help.visibleArguments(cmd)) lines.push(`.TP\n.I ${roff(help.argumentTerm(a))}\n${roff(a.description)}`);
  for (const o of help.visibleOptions(cmd)) lines.push(optionItem(o));
  const example = exampleOf(cmd);
  if (example !== undefined) lines.push('.PP\nExample:\n.PP\n.RS\n.nf', roff(example), '.fi\n.RE');
  return lines.join('\n');
}

export function renderManPage(program: Command, version: string): string {
  const commands = program.commands.filter((c) => !(c as unknown as { _hidden: boolean })._hidden);
  return [
    `.TH VMSR\\-HELPER 1 "" "vmsr\\-helper ${roff(version)}" "User Commands"`,
    '.SH NAME',
    'vmsr\\-helper \\- drop\\-in qemu\\-vmsr\\-helper with per\\-VM RAPL energy, traces and a Prometheus exporter',
    '.SH SYNOPSIS',
    '.B vmsr\\-helper',
    '[\\fIoptions\\fR]',
    '.br',
    '.B vmsr\\-helper',
    '\\fIcommand\\fR [\\fIoptions\\fR] [\\fIarguments\\fR]',
    '.SH DESCRIPTION',
    `${roff(program.description())}.`,
    'Without a command, vmsr\\-helper is the daemon: QEMU (9.1+, \\fB\\-accel kvm,rapl=true,rapl\\-helper\\-socket=PATH\\fR) asks it for the',
    "RAPL MSRs over a Unix socket, and v2 clients (\\fBwatch\\fR, \\fBstats\\fR, \\fBexporter\\fR) read every VM's share of the energy.",
    'The commands below do the other jobs. Every command answers \\fB\\-\\-help\\fR and \\fB\\-\\-version\\fR.',
    '.SH COMMANDS',
    ...commands.map(commandSection),
    '.SH OPTIONS',
    "The daemon's options (vmsr\\-helper without a command).",
    ...program.createHelp().visibleOptions(program).map(optionItem),
    '.PP\nExample:\n.PP\n.RS\n.nf',
    roff(exampleOf(program) ?? ''),
    '.fi\n.RE',
    '.SH FILES',
    '.TP\n.I /run/qemu\\-vmsr\\-helper.sock\nThe socket QEMU and the clients connect to (\\fB\\-k\\fR).',
    '.TP\n.I /etc/default/vmsr\\-helper\nThe options of the daemon and the exporter for the systemd units (Debian package).',
    '.SH SEE ALSO',
    '.BR qemu\\-system\\-x86_64 (1),',
    '.BR systemd.socket (5).',
    "The documentation in /usr/share/doc/vmsr\\-helper/docs (Debian package) or the package's docs/ folder.",
    '',
  ].join('\n');
}
