/** THE package.json walk: the vmsr-helper package this module belongs to (sources, dist/ or installed). */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

interface PackageInfo {
  root: string;
  version: string;
  /** The source revision npm records as gitHead, when present. */
  revision?: string;
}

/** The nearest directory at or above `from` whose package.json is named vmsr-helper; undefined if none. */
export function findPackage(from: string = path.dirname(fileURLToPath(import.meta.url))): PackageInfo | undefined {
  for (let dir = from; ; dir = path.dirname(dir)) {
    try {
      const pkg = JSON.parse(fs.readFileSync(path.join(dir, 'package.json'), 'utf8')) as {
        name?: unknown;
        version?: unknown;
        gitHead?: unknown;
      };
      if (pkg.name === 'vmsr-helper')
        return {
          root: dir,
          version: typeof pkg.version === 'string' ? pkg.version : '0.0.0',
          ...(typeof pkg.gitHead === 'string' && /^[0-9a-f]{7,40}$/.test(pkg.gitHead) ? { revision: pkg.gitHead } : {}),
        };
    } catch {
      // not here; keep walking up
    }
    if (path.dirname(dir) === dir) return undefined;
  }
}
