/**
 * The packed npm tarball installs with no build step and no dev dependency, runs, and carries
 * LICENSE and docs/ (which the README links to) but neither the tests nor the TypeScript sources.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { ROOT, tempDir } from '../daemon/support/daemon-process.js';
import { missing } from '../support/env.js';
import { installAsConsumer, packTarball, tarballFiles } from './support/packed.js';

const pkg = JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as {
  scripts: Record<string, string>;
  dependencies: Record<string, string>;
  devDependencies: Record<string, string>;
  engines: { node: string };
  license: string;
};

describe('the npm package', () => {
  const why = missing({ command: 'npm' });
  let dir = '';
  let tarball = '';
  let files: string[] = [];
  let how = '';

  beforeAll(() => {
    if (why) return;
    dir = tempDir('vmsr-npm-package-');
    tarball = packTarball(dir);
    files = tarballFiles(tarball);
    fs.mkdirSync(path.join(dir, 'consumer'));
    how = installAsConsumer(tarball, path.join(dir, 'consumer'));
  }, 180_000);
  afterAll(() => {
    if (dir) fs.rmSync(dir, { recursive: true, force: true });
  });

  test('the tarball carries the built code, the man page and bash completion, LICENSE, docs/, contrib/ and the bundled trace, and no tests or TypeScript', (ctx) => {
    if (why) return ctx.skip(why);
    for (const f of [
      'LICENSE',
      'README.md',
      'package.json',
      'dist/src/bin/vmsr-helper.js',
      'traces/qemu-spin-vs-idle.jsonl.gz',
      'dist/share/man/man1/vmsr-helper.1',
      'dist/share/bash-completion/completions/vmsr-helper',
    ]) {
      expect(files, f).toContain(f);
    }
    for (const doc of fs.readdirSync(path.join(ROOT, 'docs'))) expect(files, doc).toContain(`docs/${doc}`);
    const units = fs.readdirSync(path.join(ROOT, 'contrib/systemd'), { recursive: true, withFileTypes: true }).filter((e) => e.isFile());
    for (const unit of units) {
      const rel = path.relative(ROOT, path.join(unit.parentPath, unit.name));
      expect(files, rel).toContain(rel);
    }
    expect(files.filter((f) => f.startsWith('test/') || f.startsWith('dist/test/') || f.startsWith('bench/'))).toEqual([]);
    expect(files.filter((f) => f.endsWith('.ts') || f.endsWith('.map'))).toEqual([]);
    // The license text is the one package.json names.
    expect(pkg.license).toBe('GPL-2.0-only');
    expect(fs.readFileSync(path.join(ROOT, 'LICENSE'), 'utf8')).toMatch(/GNU GENERAL PUBLIC LICENSE\s+Version 2, June 1991/);
  });

  test('every link of the README to docs/ or LICENSE names a file the tarball carries', (ctx) => {
    if (why) return ctx.skip(why);
    const readme = fs.readFileSync(path.join(ROOT, 'README.md'), 'utf8');
    const links = [...readme.matchAll(/\]\(((?:docs\/|LICENSE)[^)#\s]*)/g)].map((m) => m[1]!);
    expect(links.length).toBeGreaterThan(5);
    for (const l of new Set(links)) expect(files, l).toContain(l);
  });

  test('installing it runs no build and needs no dev dependency: only the runtime ones are installed', (ctx) => {
    if (why) return ctx.skip(why);
    console.log(`consumer install: npm ci ${how}`);
    // npm runs these on a consumer's install; none may build (tsc is a dev dependency).
    for (const s of ['preinstall', 'install', 'postinstall']) expect(pkg.scripts[s], s).toBeUndefined();
    const mods = path.join(dir, 'consumer/node_modules');
    const installed = path.join(mods, 'vmsr-helper');
    expect(fs.lstatSync(installed).isSymbolicLink()).toBe(false);
    for (const d of Object.keys(pkg.dependencies)) expect(fs.existsSync(path.join(mods, d)), d).toBe(true);
    for (const d of Object.keys(pkg.devDependencies)) expect(fs.existsSync(path.join(mods, d)), d).toBe(false);
    expect(fs.existsSync(path.join(mods, '.bin/tsc'))).toBe(false);
    // dist/ came from the tarball, not from a build on install: the files are the packed ones.
    expect(fs.readFileSync(path.join(installed, 'dist/src/bin/vmsr-helper.js'))).toEqual(
      fs.readFileSync(path.join(ROOT, 'dist/src/bin/vmsr-helper.js')),
    );
  });

  test('the installed command answers --version and --help', (ctx) => {
    if (why) return ctx.skip(why);
    const bin = path.join(dir, 'consumer/node_modules/.bin/vmsr-helper');
    expect(execFileSync(bin, ['--version'], { encoding: 'utf8' }).trim()).toBe(
      `vmsr-helper ${(JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { version: string }).version}`,
    );
    const help = execFileSync(bin, ['--help'], { encoding: 'utf8' });
    expect(help).toMatch(/^Usage: vmsr-helper/m);
    expect(help).toContain('exporter');
    expect(help).toContain('demo');
  });

  test('npm install -g links the man page where man finds it, and the completion recipe of docs/install.md, run as printed, gives bash the completion', (ctx) => {
    if (why) return ctx.skip(why);
    const noMan = missing({ command: 'man' });
    if (noMan) return ctx.skip(noMan);
    expect((pkg as unknown as { man: string[] }).man).toEqual(['./dist/share/man/man1/vmsr-helper.1']);
    const prefix = path.join(dir, 'global');
    const env = { ...process.env, npm_config_prefix: prefix };
    // A global install resolves the dependencies from the registry's metadata: the npm cache's, else the registry's.
    const install = (mode: string) =>
      spawnSync('npm', ['install', '-g', mode, '--no-audit', '--no-fund', '--loglevel=error', tarball], {
        env,
        encoding: 'utf8',
        timeout: 240_000,
      });
    let r = install('--offline');
    if (r.status !== 0) r = install('--prefer-offline');
    if (r.status !== 0)
      return ctx.skip(`npm install -g could not get the dependencies' metadata (no cache, no registry): ${r.stderr.trim()}`);
    const page = path.join(prefix, 'share/man/man1/vmsr-helper.1');
    expect(fs.realpathSync(page)).toBe(
      fs.realpathSync(path.join(prefix, 'lib/node_modules/vmsr-helper/dist/share/man/man1/vmsr-helper.1')),
    );
    const man = spawnSync('man', ['vmsr-helper'], {
      env: { ...env, MANPATH: path.join(prefix, 'share/man'), MANPAGER: 'cat', PAGER: 'cat' },
      encoding: 'utf8',
    });
    expect(man.status, man.stderr).toBe(0);
    expect(man.stdout).toMatch(/VMSR-HELPER\(1\)/);
    // The recipe, as printed, in a home of its own.
    const doc = fs.readFileSync(path.join(ROOT, 'docs/install.md'), 'utf8');
    const block = /```sh\n(mkdir -p ~\/\.local\/share\/bash-completion[\s\S]*?)```/.exec(doc.replace(/^ {2}/gm, ''))![1]!;
    const home = path.join(dir, 'home');
    fs.mkdirSync(home);
    const run = spawnSync('sh', ['-ec', block], { env: { ...env, HOME: home }, encoding: 'utf8' });
    expect(run.status, run.stderr).toBe(0);
    const linked = path.join(home, '.local/share/bash-completion/completions/vmsr-helper');
    const complete = spawnSync('bash', ['-c', `source "$1" && complete -p vmsr-helper`, 'bash', linked], { encoding: 'utf8' });
    expect(complete.stdout, complete.stderr).toMatch(/^complete .* vmsr-helper$/m);
  }, 300_000);

  test('the README and docs/install.md say which Node it needs, as package.json does, and where Debian, Ubuntu and RHEL get it', () => {
    expect(pkg.engines.node).toBe('>=20');
    expect(fs.readFileSync(path.join(ROOT, 'README.md'), 'utf8')).toMatch(/Node\.js 20 or newer/);
    const doc = fs.readFileSync(path.join(ROOT, 'docs/install.md'), 'utf8');
    const section = doc.slice(doc.indexOf('### Node.js'));
    expect(section).toMatch(/Node\.js 20 or newer/);
    for (const distro of ['Debian', 'Ubuntu', 'RHEL', 'NodeSource']) expect(section, distro).toContain(distro);
  });
});
