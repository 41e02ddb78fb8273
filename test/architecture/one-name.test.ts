/**
 * One name per concept (docs/architecture.md "Where a new thing goes"): no exported type name
 * (interface, type alias, class, enum) is declared by two files of src/, and no file name other than
 * index.ts appears in two folders of src/. Checked on the real tree and, so that the check is known
 * to be able to fail, on a made-up one.
 */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');

interface SourceText {
  /** Relative to the repo root. */
  file: string;
  text: string;
}

function srcFiles(dir: string): SourceText[] {
  const out: SourceText[] = [];
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) out.push(...srcFiles(p));
    else if (e.name.endsWith('.ts') && !e.name.endsWith('.d.ts'))
      out.push({ file: path.relative(ROOT, p), text: fs.readFileSync(p, 'utf8') });
  }
  return out;
}

function exportedTypeNames(s: SourceText): string[] {
  const sf = ts.createSourceFile(s.file, s.text, ts.ScriptTarget.Latest, false);
  const names: string[] = [];
  for (const st of sf.statements) {
    const isType = ts.isInterfaceDeclaration(st) || ts.isTypeAliasDeclaration(st) || ts.isClassDeclaration(st) || ts.isEnumDeclaration(st);
    const exported = ts.canHaveModifiers(st) && (ts.getModifiers(st) ?? []).some((m) => m.kind === ts.SyntaxKind.ExportKeyword);
    if (isType && exported && st.name !== undefined) names.push(st.name.text);
  }
  return names;
}

/** Each name given twice, with the files that give it. */
function namesTwice(files: readonly SourceText[]): string[] {
  const types = new Map<string, string[]>();
  const fileNames = new Map<string, string[]>();
  for (const f of files) {
    for (const n of exportedTypeNames(f)) types.set(n, [...(types.get(n) ?? []), f.file]);
    const base = path.basename(f.file);
    if (base !== 'index.ts') fileNames.set(base, [...(fileNames.get(base) ?? []), f.file]);
  }
  const twice = (m: Map<string, string[]>, what: string): string[] =>
    [...m].filter(([, where]) => where.length > 1).map(([n, where]) => `${what} ${n}: ${where.join(', ')}`);
  return [...twice(types, 'type'), ...twice(fileNames, 'file name')];
}

describe('one name per concept', () => {
  it('src/ declares no exported type name twice and has no file name (but index.ts) twice', () => {
    expect(namesTwice(srcFiles(path.join(ROOT, 'src')))).toEqual([]);
  });

  it('names a type exported by two files and a file name in two folders, and lets index.ts and private types repeat', () => {
    const made: SourceText[] = [
      { file: 'src/a/codec.ts', text: 'export interface VmUpdate { a: number }\ninterface Pending { x: 1 }' },
      { file: 'src/b/codec.ts', text: 'export type VmUpdate = { b: number };\ninterface Pending { y: 2 }' },
      { file: 'src/a/index.ts', text: 'export class A {}' },
      { file: 'src/b/index.ts', text: 'export class B {}' },
    ];
    expect(namesTwice(made)).toEqual([
      'type VmUpdate: src/a/codec.ts, src/b/codec.ts',
      'file name codec.ts: src/a/codec.ts, src/b/codec.ts',
    ]);
  });
});
