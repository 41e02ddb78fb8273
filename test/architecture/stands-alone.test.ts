/**
 * The repository stands alone: no file points at the shared contracts folder beside it or at any
 * path outside the repository, and every relative link in the docs resolves inside it. Test files
 * are exempt: they may use ../shared fixtures when present (and skip otherwise).
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, expect, test } from 'vitest';
import { ROOT } from '../daemon/support/daemon-process.js';

/** Files git would commit (tracked and new, minus ignored ones), binary ones left out. */
function repoFiles(): string[] {
  const out = execFileSync('git', ['ls-files', '--cached', '--others', '--exclude-standard', '-z'], { cwd: ROOT, encoding: 'utf8' });
  return out
    .split('\0')
    .filter((f) => f !== '' && fs.existsSync(path.join(ROOT, f)))
    .filter((f) => !/\.(gz|elf|png|jpg|tgz)$/.test(f));
}

const isTestFile = (f: string) => f.startsWith('test/') && f.endsWith('.ts');

// Built from pieces so this file does not match itself (it is exempt anyway, as a test file).
const SHARED = ['..', 'shared'].join('/');
const FORBIDDEN: [RegExp, string][] = [
  [new RegExp(['shared', 'spec'].join('/')), 'the shared contracts folder'],
  [new RegExp(SHARED.replace(/\./g, '\\.')), 'the shared folder beside the repository'],
  [new RegExp(`\\bspec/(protocol|ratio|trace-format)\\.md`), 'a contract outside the repository (docs/ carries it)'],
  [/\/work\/(main|wt-\d+|shared|coord)\b/, 'a path on the development machine'],
];

describe('the repository stands alone', () => {
  const files = repoFiles();

  test('the file list is the repository (sanity: sources, docs and units are in it)', () => {
    for (const f of [
      'README.md',
      'docs/protocol.md',
      'docs/ratio.md',
      'docs/trace-format.md',
      'contrib/systemd/qemu-vmsr-helper.service',
      'src/bin/vmsr-helper.ts',
    ]) {
      expect(files).toContain(f);
    }
  });

  test('no file outside test/ mentions the shared folder, its contracts or a machine path', () => {
    const hits: string[] = [];
    for (const f of files) {
      if (isTestFile(f)) continue;
      const text = fs.readFileSync(path.join(ROOT, f), 'utf8');
      for (const [re, what] of FORBIDDEN) {
        const m = re.exec(text);
        if (m) hits.push(`${f}:${text.slice(0, m.index).split('\n').length}: ${m[0]} (${what})`);
      }
    }
    expect(hits).toEqual([]);
  });

  test('no file names an issue by number: code, docs and tests say what and why, not which ticket', () => {
    const hits: string[] = [];
    // Built from pieces so this file does not match itself.
    const ticket = new RegExp(['\\bissues?', '#?\\d+\\b'].join('\\s+'), 'i');
    for (const f of files) {
      const text = fs.readFileSync(path.join(ROOT, f), 'utf8');
      const m = ticket.exec(text);
      if (m) hits.push(`${f}:${text.slice(0, m.index).split('\n').length}: ${m[0]}`);
    }
    expect(hits).toEqual([]);
  });

  test('every relative link and every named source file in a Markdown file resolves inside the repository', () => {
    const bad: string[] = [];
    for (const f of files.filter((x) => x.endsWith('.md'))) {
      const text = fs.readFileSync(path.join(ROOT, f), 'utf8');
      for (const m of text.matchAll(/\]\(([^)\s]+)\)/g)) {
        const target = m[1]!.split('#')[0]!;
        if (target === '' || /^[a-z]+:/i.test(target)) continue; // anchors, URLs
        const abs = path.resolve(ROOT, path.dirname(f), target);
        if (!abs.startsWith(ROOT + path.sep) || !fs.existsSync(abs)) bad.push(`${f}: ${m[1]}`);
      }
      // Source files the docs name (`src/trace/reader.ts`) exist under those names.
      for (const m of text.matchAll(/`(src\/[\w./-]+\.ts)`/g)) if (!fs.existsSync(path.join(ROOT, m[1]!))) bad.push(`${f}: ${m[1]}`);
    }
    expect(bad).toEqual([]);
  });
});
