/**
 * The README as a newcomer meets it: short enough to read in ten minutes, and its commands run as
 * written in a fresh clone. The clone is `git clone` of this repository (its committed HEAD) into a
 * temporary folder; its node_modules is a symbolic link to this checkout's (the tests run offline,
 * and `npm ci` would fetch what is already here), and `npm run build` stands in for the `prepare`
 * step `npm ci` runs. Then the README's main job, its alias line and its demo run there as printed.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { ROOT, tempDir } from '../daemon/support/daemon-process.js';
import { missing } from '../support/env.js';

const README = fs.readFileSync(path.join(ROOT, 'README.md'), 'utf8');
/** About ten minutes of reading. */
const MAX_README_LINES = 300;

/** The command lines of the README's first ```sh block under `heading`, comments removed. */
function commandsUnder(heading: string): string[] {
  const at = README.indexOf(heading);
  expect(at, heading).toBeGreaterThanOrEqual(0);
  const block = /```sh\n([\s\S]*?)```/.exec(README.slice(at))![1]!;
  return block
    .split('\n')
    .map((l) => l.replace(/\s+#.*$/, '').trim())
    .filter(Boolean);
}

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

describe('the README', () => {
  test(`the README holds at most ${MAX_README_LINES} lines, and links the docs the moved parts went to`, () => {
    expect(README.split('\n').length).toBeLessThanOrEqual(MAX_README_LINES);
    for (const doc of ['docs/install.md', 'docs/guide.md', 'docs/performance.md', 'docs/design.md', 'docs/try-it.md'])
      expect(README, doc).toContain(`](${doc})`);
    // What npm test costs, and the fast part.
    expect(README).toMatch(/npm test\s+# every test: about \d+ minutes/);
    expect(README).toContain('npx vitest run test/ratio test/protocol test/common test/trace');
    // The bundled trace's energy is called what it is.
    expect(README).toMatch(/\*\*energy is synthetic\*\*/);
  });

  test('docs/performance.md lists every bench suite bench/index.ts runs, and no other', () => {
    const index = fs.readFileSync(path.join(ROOT, 'bench/index.ts'), 'utf8');
    const suites = [.../const all = \[([^\]]*)\]/.exec(index)![1]!.matchAll(/'([\w-]+)'/g)].map((m) => m[1]!);
    expect(suites.length).toBeGreaterThan(5);
    const doc = fs.readFileSync(path.join(ROOT, 'docs/performance.md'), 'utf8');
    const listed = [...doc.matchAll(/^\| `([\w-]+)` \|/gm)].map((m) => m[1]!);
    expect(listed).toEqual(suites);
  });

  test("the README's two commands, its alias and its demo run as written in a fresh clone, the main job in seconds and without npx", (ctx) => {
    const why = missing({ command: 'git' });
    if (why) return ctx.skip(why);
    if (spawnSync('git', ['-C', ROOT, 'rev-parse', 'HEAD']).status !== 0) return ctx.skip(`${ROOT} is not a git checkout`);
    const dir = tempDir('vmsr-clone-');
    dirs.push(dir);
    const clone = path.join(dir, 'vmsr-helper');
    execFileSync('git', ['clone', '--quiet', ROOT, clone], { stdio: 'ignore' });
    fs.symlinkSync(path.join(ROOT, 'node_modules'), path.join(clone, 'node_modules'));

    const [install, mainJob, ...more] = commandsUnder('## Two commands');
    expect(install).toBe('npm ci');
    expect(more).toEqual([]);
    expect(mainJob).toMatch(/^node dist\/src\/bin\/vmsr-helper\.js replay$/);
    // npm ci's prepare step, with the modules already linked.
    execFileSync('npm', ['run', 'build', '--silent'], { cwd: clone, stdio: 'ignore', timeout: 240_000 });

    const sh = (line: string, timeout = 60_000) => {
      const t0 = process.hrtime.bigint();
      const r = spawnSync('bash', ['-O', 'expand_aliases', '-c', line], { cwd: clone, encoding: 'utf8', timeout });
      return { ...r, seconds: Number(process.hrtime.bigint() - t0) / 1e9 };
    };
    const first = sh(mainJob!);
    expect(first.status, first.stderr).toBe(0);
    expect(first.stdout).toMatch(/^vm-spin\s+\d+\s+running\s+0\s/m);
    expect(first.stdout).toContain('energy counters SYNTHESISED');
    // "In under a second" on a quiet machine; a loaded one gets 10 s, still far from npx's 12 s of
    // install and build on every first run.
    console.log(`main job in the fresh clone, first run: ${first.seconds.toFixed(2)} s`);
    expect(first.seconds).toBeLessThan(10);

    // The alias line, then a docs command written for an installed host.
    const alias = /`(alias vmsr-helper="node \$PWD\/dist\/src\/bin\/vmsr-helper\.js")`/.exec(README)![1]!;
    const aliased = sh(`${alias}\nvmsr-helper --version && vmsr-helper replay --json | tail -n 1`);
    expect(aliased.status, aliased.stderr).toBe(0);
    expect(aliased.stdout).toMatch(/^vmsr-helper \d+\.\d+\.\d+/);

    // The demo, as written, stopped by itself; the commands it prints run as printed in the clone.
    const [demo] = commandsUnder('## The demo');
    expect(demo).toBe('node dist/src/bin/vmsr-helper.js demo');
    const ran = sh(`${demo} --no-vm --duration 4 --listen 127.0.0.1:0`, 90_000);
    expect(ran.status, ran.stderr).toBe(0);
    const printed = /^ {2}(node dist\/src\/bin\/vmsr-helper\.js stats -k \S+)$/m.exec(ran.stdout);
    expect(printed, ran.stdout).not.toBeNull();
  }, 360_000);
});
