/**
 * The npm package as a user gets it: `npm pack` of this clone, and an install of that tarball the way
 * a consumer's `npm install` makes it, offline: a project whose lockfile names the tarball and, for
 * the production dependencies, the entries of this repository's package-lock.json (so npm takes
 * them from its cache by integrity, with no registry metadata needed). dist/ is built once by
 * ensureBuilt, as the other tests build it, and packed without scripts: running `prepare` here would
 * rewrite dist/ under the feet of test files running in parallel. What `npm pack` runs by itself is
 * checked in package.json.
 */
import { execFileSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { ensureBuilt, ROOT } from '../../daemon/support/daemon-process.js';

interface LockEntry {
  dev?: boolean;
  [key: string]: unknown;
}

export function npm(args: string[], cwd: string): string {
  return execFileSync('npm', [...args, '--no-audit', '--no-fund', '--loglevel=error'], {
    cwd,
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'pipe'],
  });
}

/** `npm pack` of the built clone into `dir`; the tarball's path. */
export function packTarball(dir: string): string {
  ensureBuilt();
  const name = npm(['pack', '--ignore-scripts', '--pack-destination', dir], ROOT).trim().split('\n').at(-1)!;
  return path.join(dir, name);
}

/** The names of the entries of a .tgz, without the leading `package/`. */
export function tarballFiles(tarball: string): string[] {
  return execFileSync('tar', ['-tzf', tarball], { encoding: 'utf8' })
    .split('\n')
    .filter(Boolean)
    .map((f) => f.replace(/^package\//, ''));
}

/**
 * Installs `tarball` into the project `dir` as a consumer would, with no dev dependency and no build;
 * returns how npm was run (offline, or --prefer-offline when the cache lacked something).
 */
export function installAsConsumer(tarball: string, dir: string): string {
  const pkg = JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as Record<string, unknown>;
  const lock = JSON.parse(fs.readFileSync(path.join(ROOT, 'package-lock.json'), 'utf8')) as { packages: Record<string, LockEntry> };
  const file = path.basename(tarball);
  fs.copyFileSync(tarball, path.join(dir, file));
  const integrity = `sha512-${crypto.createHash('sha512').update(fs.readFileSync(tarball)).digest('base64')}`;
  const root = { name: 'consumer', version: '1.0.0', dependencies: { [pkg.name as string]: `file:${file}` } };
  const packages: Record<string, unknown> = {
    '': root,
    [`node_modules/${pkg.name as string}`]: {
      version: pkg.version,
      resolved: `file:${file}`,
      integrity,
      license: pkg.license,
      dependencies: pkg.dependencies,
      engines: pkg.engines,
      bin: pkg.bin,
    },
  };
  for (const [k, v] of Object.entries(lock.packages)) if (k !== '' && v.dev !== true) packages[k] = v;
  fs.writeFileSync(path.join(dir, 'package.json'), JSON.stringify(root, null, 2));
  fs.writeFileSync(
    path.join(dir, 'package-lock.json'),
    JSON.stringify({ name: 'consumer', lockfileVersion: 3, requires: true, packages }, null, 2),
  );
  try {
    npm(['ci', '--offline'], dir);
    return 'offline';
  } catch {
    npm(['ci', '--prefer-offline'], dir);
    return 'prefer-offline (the npm cache lacked a package)';
  }
}
