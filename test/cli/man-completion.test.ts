/**
 * The man page and the bash completion, made by the build step (bin/make-docs.ts) from the CLI's own
 * definitions: man renders the page with every command and option in it, without a warning; bash
 * loads the completion and completes a command, an option and an option's choices.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { buildCli } from '../../src/cli/cli.js';
import { ensureBuilt, ROOT, tempDir } from '../daemon/support/daemon-process.js';

let dir: string;
beforeAll(() => {
  ensureBuilt();
  dir = tempDir('vmsr-docs-');
  execFileSync(process.execPath, [path.join(ROOT, 'dist/src/bin/make-docs.js'), dir]);
});
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

function has(tool: string): boolean {
  return spawnSync('sh', ['-c', `command -v ${tool}`]).status === 0;
}

describe('man page', () => {
  test('man -l renders the page, without warnings, with every command and every option of each', async (ctx) => {
    if (!has('man') || !has('groff')) {
      console.log('skipped: man or groff is not installed (.ci/run installs man-db)');
      ctx.skip();
    }
    const page = path.join(dir, 'man/man1/vmsr-helper.1');
    const r = spawnSync('man', ['--warnings', '-l', page], {
      encoding: 'utf8',
      env: { ...process.env, MANWIDTH: '100', MAN_KEEP_FORMATTING: '' },
    });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stderr).toBe('');
    const text = r.stdout.replace(/.\x08/g, '');
    expect(text).toMatch(/^VMSR-HELPER\(1\)/);
    const program = await buildCli(true);
    for (const cmd of [program, ...program.commands]) {
      if (cmd !== program) expect(text).toContain(`vmsr-helper ${cmd.name()}`);
      for (const o of cmd.options) expect(text, `${cmd.name()} ${o.flags}`).toContain(o.long!);
    }
    expect(text).toContain('--web.listen-address, --listen');
    expect(text).toContain('vmsr-helper hash-password < password.txt');
  });
});

describe('bash completion', () => {
  /** What the completion offers for the words typed so far (the last one being completed). */
  function complete(words: string[]): string[] {
    const file = path.join(dir, 'bash-completion/completions/vmsr-helper');
    const script = `source '${file}'; complete -p vmsr-helper >/dev/null || exit 3; COMP_WORDS=(${words.map((w) => `'${w}'`).join(' ')}); COMP_CWORD=${words.length - 1}; _vmsr_helper; printf '%s\\n' "\${COMPREPLY[@]}"`;
    const r = spawnSync('bash', ['--norc', '-c', script], { encoding: 'utf8' });
    expect(r.status, r.stderr).toBe(0);
    return r.stdout.split('\n').filter((l) => l !== '');
  }

  test('bash loads the completion and completes a command, an option, a choice and a node_exporter flag', () => {
    expect(complete(['vmsr-helper', 'exp'])).toEqual(['exporter']);
    expect(complete(['vmsr-helper', 'hash'])).toEqual(['hash-password']);
    expect(complete(['vmsr-helper', 'exporter', '--web.l'])).toEqual(['--web.listen-address']);
    expect(complete(['vmsr-helper', 'stats', '--on'])).toEqual(['--once']);
    expect(complete(['vmsr-helper', '--energy-source', 's'])).toEqual(['synthetic']);
    expect(complete(['vmsr-helper', '--no-disc'])).toEqual(['--no-discovery']);
    expect(complete(['vmsr-helper', 'help', 'rep'])).toEqual(['replay']);
  });
});
