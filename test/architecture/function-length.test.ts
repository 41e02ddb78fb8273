/**
 * The function-length rule as the house defines it (README "Layout"): in src/, at most 80 lines per
 * function, comments and blank lines not counted, and a nested closure counted inside the function
 * that holds it. Run through ESLint with the repository's own configuration, on made-up sources, so
 * that a change to the rule's options that counts otherwise fails here.
 */
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { ESLint } from 'eslint';
import { describe, expect, it } from 'vitest';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const eslint = new ESLint({ cwd: ROOT });

/**
 * A function of `code` lines (its first and last included), each statement followed by `padding`
 * (comment or blank lines); `nested` puts about half of its statements in an inner arrow.
 */
function source(code: number, padding: string[] = [], nested = false): string {
  const body: string[] = [];
  const inner = nested ? Math.floor(code / 2) : 0;
  for (let i = 0; i < code - 4 - (nested ? 3 : 0) - inner; i++) body.push(`  n += ${i};`, ...padding);
  if (nested) {
    body.push('  const inner = () => {');
    for (let i = 0; i < inner; i++) body.push(`    n += ${i};`, ...padding);
    body.push('  };', '  inner();');
  }
  return ['export function f(): number {', '  let n = 0;', ...body, '  return n;', '}', ''].join('\n');
}

async function tooLong(text: string, filePath = 'src/x.ts'): Promise<string[]> {
  const [r] = await eslint.lintText(text, { filePath: path.join(ROOT, filePath) });
  return r!.messages.filter((m) => m.ruleId === 'max-lines-per-function').map((m) => m.message);
}

describe('function length', () => {
  it('allows 80 code lines in src/ and refuses 81', async () => {
    expect(await tooLong(source(80))).toEqual([]);
    expect(await tooLong(source(81))).toEqual([expect.stringMatching(/too many lines \(81\)\. Maximum allowed is 80/)]);
  });

  it('does not count comments and blank lines', async () => {
    expect(await tooLong(source(80, ['  // a comment', '', '  /* another */']))).toEqual([]);
  });

  it('counts a nested closure inside the function that holds it', async () => {
    expect(await tooLong(source(81, [], true))).toEqual([expect.stringMatching(/too many lines \(81\)/)]);
  });

  it('leaves test files alone (a describe() is a list of cases)', async () => {
    expect(await tooLong(source(200), 'test/x.test.ts')).toEqual([]);
  });
});
