/** Build step (npm run build): the man page and the bash completion under DIR (default dist/share). */
import fs from 'node:fs';
import path from 'node:path';
import { buildCli } from '../cli/cli.js';
import { renderBashCompletion } from '../cli/completion.js';
import { renderManPage } from '../cli/man-page.js';
import { VERSION } from '../cli/version.js';

const MAN_PAGE = 'man/man1/vmsr-helper.1';
const BASH_COMPLETION = 'bash-completion/completions/vmsr-helper';

const dir = process.argv[2] ?? 'dist/share';
const program = await buildCli(true);
for (const [file, text] of [
  [MAN_PAGE, renderManPage(program, VERSION)],
  [BASH_COMPLETION, renderBashCompletion(program)],
] as const) {
  fs.mkdirSync(path.dirname(path.join(dir, file)), { recursive: true });
  fs.writeFileSync(path.join(dir, file), text);
}
