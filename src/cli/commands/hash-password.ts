/** `vmsr-helper hash-password` (docs/exporter.md): typed twice without echo on a terminal, else stdin less one trailing newline. */
import type { Command } from 'commander';
import { BCRYPT_COST, bcryptHash } from '../../os/bcrypt.js';
import { wholeNumberArg } from '../options.js';
import { UsageError } from '../cli-errors.js';

/** The most a piped password may hold: more is no password (bcrypt reads 72 bytes) but a wrong file. */
const MAX_INPUT_BYTES = 4096;

/** Lines typed without echo, one per prompt; one reader for all, as a chunk may hold lines typed ahead. */
function readHiddenLines(prompts: readonly string[]): Promise<string[]> {
  return new Promise((resolve, reject) => {
    const stdin = process.stdin;
    const lines: string[] = [];
    let text = '';
    const done = (err: Error | null): void => {
      stdin.setRawMode(false);
      stdin.pause();
      stdin.off('data', onData);
      if (err) reject(err);
      else resolve(lines);
    };
    const onData = (chunk: string): void => {
      for (const ch of chunk) {
        if (ch === '\r' || ch === '\n') {
          lines.push(text);
          text = '';
          process.stderr.write('\n');
          if (lines.length === prompts.length) return done(null);
          process.stderr.write(prompts[lines.length]!);
        } else if (ch === '\u0003' || ch === '\u0004') {
          process.stderr.write('\n');
          return done(new UsageError('no password given (interrupted)'));
        } else if (ch === '\u007f' || ch === '\b') text = text.slice(0, -1);
        else if (text.length >= MAX_INPUT_BYTES) return done(new UsageError(`the password is longer than ${MAX_INPUT_BYTES} characters`));
        else text += ch;
      }
    };
    // Echo off before the prompt: what is typed as soon as it shows is never echoed.
    stdin.setRawMode(true);
    process.stderr.write(prompts[0]!);
    stdin.setEncoding('utf8');
    stdin.on('data', onData);
    stdin.resume();
  });
}

/** The password from a pipe or file: everything, less one trailing newline. */
async function readPiped(): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of process.stdin as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > MAX_INPUT_BYTES) throw new UsageError(`stdin holds more than ${MAX_INPUT_BYTES} bytes: give the password alone`);
    chunks.push(chunk);
  }
  return Buffer.concat(chunks)
    .toString('utf8')
    .replace(/\r?\n$/, '');
}

async function readPassword(): Promise<string> {
  if (!process.stdin.isTTY) return readPiped();
  const [first, again] = await readHiddenLines(['Password: ', 'Again: ']);
  if (first !== again) throw new UsageError('the two passwords differ');
  return first!;
}

export function addHashPasswordCommand(program: Command): void {
  program
    .command('hash-password')
    .description(
      "print the bcrypt hash of a password read from stdin (typed twice on a terminal), for basic_auth_users in the exporter's --web.config.file",
    )
    .option(
      '--cost <n>',
      `bcrypt cost, ${BCRYPT_COST.min}..${BCRYPT_COST.max}: each step doubles the work of every check (default ${BCRYPT_COST.default})`,
      wholeNumberArg('--cost', BCRYPT_COST.max),
    )
    .action(async (o: { cost?: number }) => {
      const password = await readPassword();
      if (password === '') throw new UsageError('the password is empty');
      process.stdout.write(`${await bcryptHash(password, o.cost ?? BCRYPT_COST.default)}\n`);
    });
}
