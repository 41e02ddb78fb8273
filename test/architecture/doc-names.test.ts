/**
 * docs/architecture.md names only what exists: every path, file, folder and code name it puts in
 * backquotes is checked against the tree (doc-names.ts), so a rename or a move that leaves the doc
 * behind fails here. The check runs on the real document and, so that it is known to be able to
 * fail, on a small made-up one.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { missingNames } from './doc-names.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');

describe('docs/architecture.md', () => {
  it('names only files, folders, functions and types that exist, each where it says', () => {
    const doc = fs.readFileSync(path.join(ROOT, 'docs/architecture.md'), 'utf8');
    expect(doc).toContain('`src/ratio/attribution.ts`');
    expect(missingNames(doc, ROOT)).toEqual([]);
  });

  describe('on a made-up tree', () => {
    const root = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-doc-names-'));
    afterAll(() => fs.rmSync(root, { recursive: true, force: true }));
    fs.mkdirSync(path.join(root, 'src/helper/v2'), { recursive: true });
    fs.writeFileSync(path.join(root, 'src/helper/v2/service.ts'), 'export function createV2Service() { return { handler() {} }; }\n');
    fs.writeFileSync(path.join(root, 'src/helper/daemon.ts'), 'export class Daemon { start() {} }\n');
    const check = (doc: string) => missingNames(doc, root);

    it('accepts what exists: paths, names in their files, file names under the block folder', () => {
      expect(
        check(
          [
            '1. `src/helper/v2/service.ts` (`handler`): then `Daemon` (`daemon.ts`) calls `start()`.',
            '',
            '| 9 | `src/helper/` | the daemon (`daemon.ts`), `v2/` (`v2/service.ts`) |',
            '',
            'Syscalls as the world spells them: `pread`, `SCM_RIGHTS`.',
          ].join('\n'),
        ),
      ).toEqual([]);
    });

    it('reports a missing path, file, folder, a name not in its file and a name nowhere', () => {
      expect(
        check(
          [
            'The re-exec lives in `src/helper/lifecycle/privileged-start.ts`.',
            '',
            '| 9 | `src/helper/` | `assemble.ts`, `server/` |',
            '',
            '1. `src/helper/daemon.ts` (`handler`) and `runDaemon` alone.',
          ].join('\n'),
        ),
      ).toEqual([
        'line 1: `src/helper/lifecycle/privileged-start.ts` does not exist',
        'line 3: `assemble.ts`: no such file',
        'line 3: `server/`: no such folder',
        'line 5: `handler` is declared neither in `src/helper/daemon.ts`',
        'line 5: `runDaemon` is declared nowhere in src/',
      ]);
    });

    it('ignores fenced code', () => {
      expect(check('```\n`src/nothing.ts`\n```\n')).toEqual([]);
    });
  });
});
