/** The one package.json walk (src/os/package-info.ts). */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { expect, test } from 'vitest';
import { findPackage } from '../../src/os/package-info.js';
import pkg from '../../package.json' with { type: 'json' };

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');

test('finds the vmsr-helper root and version from a module deep inside it', () => {
  expect(findPackage(path.join(ROOT, 'src/os'))).toEqual({ root: ROOT, version: pkg.version });
  expect(findPackage(path.join(ROOT, 'dist/src/cli/commands'))).toEqual({ root: ROOT, version: pkg.version });
});

test('skips a package.json of another name on the way up, and gives undefined when there is none', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-pkg-'));
  try {
    fs.mkdirSync(path.join(dir, 'inner/deeper'), { recursive: true });
    fs.writeFileSync(path.join(dir, 'inner/package.json'), JSON.stringify({ name: 'other', version: '9.9.9' }));
    expect(findPackage(path.join(dir, 'inner/deeper'))).toBeUndefined();
    fs.writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ name: 'vmsr-helper', version: '1.2.3' }));
    expect(findPackage(path.join(dir, 'inner/deeper'))).toEqual({ root: dir, version: '1.2.3' });
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
