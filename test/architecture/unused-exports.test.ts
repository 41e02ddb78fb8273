/**
 * No export that nothing imports (docs/architecture.md, "Checks that keep the shape"): an export of a
 * src/ file is imported by another file of src/, test/ or bench/, or it is not exported (used only
 * in its file) or not there (used nowhere). The check runs on the real tree and, so that it is
 * known to be able to fail, on a small made-up one.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { programOf, unusedExports, type UnusedExport } from './unused-exports.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');

const describeUnused = (u: UnusedExport) =>
  `${u.file}:${u.line} ${u.name}: ${u.usedInFile ? 'used only in its file: drop the export' : 'used nowhere: delete it'}`;

describe('unused exports', () => {
  it('src/ exports nothing that no other file of src/, test/ or bench/ imports', () => {
    const program = programOf(path.join(ROOT, 'tsconfig.test.json'));
    expect(program.getSourceFiles().some((f) => f.fileName.endsWith('src/ratio/attribution.ts'))).toBe(true);
    expect(unusedExports(program, path.join(ROOT, 'src'), ROOT).map(describeUnused)).toEqual([]);
  }, 120_000);

  describe('on a made-up tree', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-unused-exports-'));
    afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));
    const write = (name: string, text: string) => {
      fs.mkdirSync(path.dirname(path.join(dir, name)), { recursive: true });
      fs.writeFileSync(path.join(dir, name), text);
    };
    write(
      'tsconfig.json',
      JSON.stringify({
        compilerOptions: { target: 'ES2022', module: 'NodeNext', moduleResolution: 'NodeNext', strict: true, types: [] },
        include: ['**/*.ts'],
      }),
    );
    write(
      'src/a.ts',
      [
        'export const named = 1;',
        'export const viaNamespace = 2;',
        'export const viaImport = 3;',
        'export const viaReexport = 4;',
        'export interface AsType { x: number }',
        'export const selfOnly = 5;',
        'export const nowhere = 6;',
        'export const viaTest = 7;',
        'export const total = selfOnly + 1;',
      ].join('\n'),
    );
    write('src/index.ts', "export { viaReexport } from './a.js';\n");
    write(
      'src/b.ts',
      [
        "import { named, type AsType } from './a.js';",
        "import * as a from './a.js';",
        "import { viaReexport } from './index.js';",
        'export const use = (t: AsType) => named + a.viaNamespace + viaReexport + t.x + a.total;',
        "export async function later() { const { viaImport } = await import('./a.js'); return viaImport; }",
      ].join('\n'),
    );
    write(
      'test/b.test.ts',
      "import { viaTest } from '../src/a.js';\nimport { use, later } from '../src/b.js';\nexport const t = [viaTest, use, later];\n",
    );
    const found = unusedExports(programOf(path.join(dir, 'tsconfig.json')), fs.realpathSync(path.join(dir, 'src')), fs.realpathSync(dir));

    it('finds an export used only in its file and one used nowhere', () => {
      expect(found.map((u) => [u.file, u.name, u.usedInFile])).toEqual([
        ['src/a.ts', 'selfOnly', true],
        ['src/a.ts', 'nowhere', false],
      ]);
    });

    it('counts named, type, namespace, re-exported, import() and test imports as uses', () => {
      const names = found.map((u) => u.name);
      for (const used of ['named', 'AsType', 'viaNamespace', 'viaReexport', 'viaImport', 'viaTest', 'total', 'use', 'later'])
        expect(names).not.toContain(used);
    });
  });
});
