import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

/** The nearest package.json above this module: dist/src/helper when built, src/helper when tests import the sources. */
function packageJson(): string {
  for (let dir = path.dirname(fileURLToPath(import.meta.url)); ; dir = path.dirname(dir)) {
    const p = path.join(dir, 'package.json');
    if (fs.existsSync(p)) return p;
    if (path.dirname(dir) === dir) throw new Error(`no package.json above ${fileURLToPath(import.meta.url)}`);
  }
}

const pkg = JSON.parse(fs.readFileSync(packageJson(), 'utf8')) as { version: string };
export const VERSION: string = pkg.version;
