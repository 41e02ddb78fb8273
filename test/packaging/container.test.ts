/**
 * contrib/container/Containerfile: its structure checked here on any machine (stages, every COPY
 * source in the build context, production modules only in the runtime stage, the documented run
 * lines naming what the daemon needs), and the image built and run where a container builder and
 * the base image are at hand (podman, buildah, or docker with a running daemon); elsewhere the build
 * test says why it did not run.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, expect, test } from 'vitest';
import { ROOT } from '../daemon/support/daemon-process.js';
import { which } from '../support/env.js';

const RECIPE = path.join(ROOT, 'contrib/container/Containerfile');

interface Instruction {
  op: string;
  args: string;
}

/** The instructions of a Containerfile: comments dropped, continuation lines joined. */
function instructions(text: string): Instruction[] {
  const joined = text
    .split('\n')
    .filter((l) => !/^\s*#/.test(l))
    .join('\n')
    .replace(/\\\n/g, ' ');
  return joined
    .split('\n')
    .map((l) => l.trim())
    .filter(Boolean)
    .map((l) => {
      const m = /^(\S+)\s*(.*)$/.exec(l)!;
      return { op: m[1]!.toUpperCase(), args: m[2]! };
    });
}

/** Instructions grouped by stage (FROM starts one). */
function stages(list: Instruction[]): { from: string; name?: string; body: Instruction[] }[] {
  const out: { from: string; name?: string; body: Instruction[] }[] = [];
  for (const i of list) {
    if (i.op === 'FROM') {
      const m = /^(\S+)(?:\s+AS\s+(\S+))?$/i.exec(i.args)!;
      out.push({ from: m[1]!, ...(m[2] ? { name: m[2] } : {}), body: [] });
    } else if (out.length > 0) out.at(-1)!.body.push(i);
  }
  return out;
}

/** Whether a path of the build context is left out by .dockerignore (its simple patterns: a name or a glob of one). */
function ignored(rel: string): boolean {
  const patterns = fs
    .readFileSync(path.join(ROOT, '.dockerignore'), 'utf8')
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l && !l.startsWith('#'));
  const first = rel.split('/')[0]!;
  return patterns.some((p) => p === first || (p.startsWith('*') && rel.endsWith(p.slice(1))));
}

/** A builder that can build here, or why none can. */
function builder(): { cmd: string[] } | { why: string } {
  if (which('podman')) return { cmd: ['podman', 'build'] };
  if (which('buildah')) return { cmd: ['buildah', 'bud'] };
  if (which('docker')) {
    const info = spawnSync('docker', ['info'], { encoding: 'utf8', timeout: 20_000 });
    if (info.status === 0) return { cmd: ['docker', 'build'] };
    return {
      why: `docker is installed but its daemon does not answer (${(info.stderr || info.stdout).trim().split('\n').at(-1)}); podman and buildah are not installed`,
    };
  }
  return { why: 'no container builder: podman, buildah and docker are not installed' };
}

describe('the container recipe', () => {
  const text = fs.readFileSync(RECIPE, 'utf8');
  const list = instructions(text);
  const all = stages(list);

  test('it has a build stage, a production-modules stage and a runtime stage on one Node 20 base', () => {
    expect(all.map((s) => s.name ?? '(runtime)')).toEqual(['build', 'modules', '(runtime)']);
    const arg = list.find((i) => i.op === 'ARG' && i.args.startsWith('NODE_IMAGE='));
    expect(arg?.args).toMatch(/^NODE_IMAGE=\S*node:20[-\w]*$/);
    for (const s of all) expect(s.from).toBe('${NODE_IMAGE}');
    const run = (s: (typeof all)[number]) => s.body.filter((i) => i.op === 'RUN').map((i) => i.args);
    expect(run(all[0]!).join('\n')).toMatch(/npm ci .*[\s\S]*tsc -p tsconfig\.json/);
    expect(run(all[1]!).join('\n')).toMatch(/npm ci --omit=dev --ignore-scripts/);
    // The runtime stage installs nothing: its modules come from the production-only stage.
    const runtime = all[2]!;
    expect(run(runtime).join('\n')).not.toMatch(/npm (ci|install)/);
    expect(runtime.body.filter((i) => i.op === 'COPY' && i.args.startsWith('--from=')).map((i) => i.args)).toEqual([
      '--from=modules /app/node_modules ./node_modules',
      '--from=build /src/dist/src ./dist/src',
    ]);
    expect(runtime.body.find((i) => i.op === 'ENTRYPOINT')?.args).toBe('["vmsr-helper"]');
    expect(runtime.body.find((i) => i.op === 'VOLUME')?.args).toBe('/run/vmsr-helper');
  });

  test('every COPY from the build context names a file or folder the repository has, and .dockerignore keeps', () => {
    const sources = list.filter((i) => i.op === 'COPY' && !i.args.startsWith('--from=')).flatMap((i) => i.args.split(/\s+/).slice(0, -1));
    expect(sources.length).toBeGreaterThan(5);
    for (const s of sources) {
      expect(fs.existsSync(path.join(ROOT, s)), s).toBe(true);
      expect(ignored(s), `${s} is left out by .dockerignore`).toBe(false);
    }
    // What the image builds itself stays out of the context (node_modules here is a link, dist/ is the host's build).
    for (const p of ['node_modules', 'dist', 'test']) expect(ignored(p), p).toBe(true);
  });

  test('the documented run lines give the daemon the MSR devices, its capabilities, the host pids and the socket volume', () => {
    const doc = fs.readFileSync(path.join(ROOT, 'docs/packaging.md'), 'utf8');
    const daemon = /```sh\n(podman run -d --name vmsr-helper [\s\S]*?)```/.exec(doc)?.[1]?.replace(/\\\n/g, ' ') ?? '';
    for (const part of [
      '--pid=host',
      '--cap-drop=all',
      '--cap-add=SYS_RAWIO',
      '--device %s:%s:r',
      '/dev/cpu/[0-9]*/msr',
      '-v /run/vmsr-helper:/run/vmsr-helper',
      '-k /run/vmsr-helper/vmsr.sock',
    ]) {
      expect(daemon, part).toContain(part);
    }
    const exporter = /```sh\n(podman run -d --name vmsr-exporter [\s\S]*?)```/.exec(doc)?.[1]?.replace(/\\\n/g, ' ') ?? '';
    expect(exporter).toMatch(
      /--user 65534:\d+ .*-v \/run\/vmsr-helper:\/run\/vmsr-helper[\s\S]*vmsr-helper exporter --socket \/run\/vmsr-helper\/vmsr\.sock/,
    );
  });

  test('the image builds and its command answers --version', (ctx) => {
    const b = builder();
    if ('why' in b) return ctx.skip(b.why);
    const tag = `vmsr-helper-test:${process.pid}`;
    const build = spawnSync(b.cmd[0]!, [...b.cmd.slice(1), '-f', RECIPE, '-t', tag, ROOT], { encoding: 'utf8', timeout: 900_000 });
    if (build.status !== 0 && /pull|registry|manifest|resolve|network|dial tcp/i.test(build.stderr + build.stdout)) {
      const base = /^ARG NODE_IMAGE=(\S+)$/m.exec(text)?.[1] ?? 'the base image';
      return ctx.skip(
        `${b.cmd.join(' ')} cannot build offline: the base image ${base} is not stored here and cannot be pulled (no registry access): ` +
          (build.stderr || build.stdout).trim().split('\n').at(-1)!,
      );
    }
    expect(build.status, build.stderr).toBe(0);
    try {
      const runner = b.cmd[0] === 'buildah' ? 'podman' : b.cmd[0]!;
      const out = execFileSync(runner, ['run', '--rm', tag, '--version'], { encoding: 'utf8' });
      expect(out.trim()).toMatch(/^vmsr-helper \d+\.\d+\.\d+/);
    } finally {
      spawnSync(b.cmd[0] === 'buildah' ? 'buildah' : b.cmd[0]!, b.cmd[0] === 'buildah' ? ['rmi', tag] : ['rmi', '-f', tag]);
    }
  }, 900_000);
});
