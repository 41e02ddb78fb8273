/**
 * The command blocks of the user's docs run as printed. Every ```sh block of DOCS carries a marker
 * on the line before it (the convention, docs/architecture.md "Docs"):
 *
 *   <!-- runnable -->                   run by `sh -e` in a fresh directory; must exit 0
 *   <!-- runnable: until Ctrl-C -->     each line a command that runs until stopped: started, given
 *                                       SIGINT once it printed on stdout, must end with status 0
 *   <!-- runnable: beside the demo -->  run while `vmsr-helper demo` runs, its socket in place of the
 *                                       docs' /tmp/vmsr-demo-XXXXXX (its directory); must exit 0
 *   <!-- runnable: needs X -->          as `runnable`, skipped with the reason when X (root, or a
 *                                       command) is missing
 *   <!-- not runnable: REASON -->       never run; the reason says why (and where it is tested)
 *
 * Each runnable block runs twice: in a clone (this checkout's dist/, `node dist/...` lines as
 * printed) and installed from the packed tarball (`vmsr-helper` on PATH is the installed one;
 * blocks with `node dist/` are the clone's only). The test prints how many blocks it ran and skipped.
 */
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { BIN, ROOT, spawnHelper, tempDir, waitFor, type DaemonChild } from '../daemon/support/daemon-process.js';
import { isRoot, which } from '../support/env.js';
import { installAsConsumer, packTarball } from './support/packed.js';

const DOCS = ['README.md', 'docs/try-it.md', 'docs/guide.md', 'docs/guest-operator.md'];
const DEMO_DIR = '/tmp/vmsr-demo-XXXXXX';
/** The most a runnable block may take, and a long-running one to print its first line. */
const BLOCK_TIMEOUT_MS = 120_000;

interface Block {
  doc: string;
  line: number;
  marker: string;
  text: string;
}

/** The ```sh blocks of a doc, each with the marker on the line before it ('' when none). */
function shBlocks(doc: string): Block[] {
  const lines = fs.readFileSync(path.join(ROOT, doc), 'utf8').split('\n');
  const out: Block[] = [];
  for (let i = 0; i < lines.length; i++) {
    if (!/^\s*```sh\s*$/.test(lines[i]!)) continue;
    const indent = /^\s*/.exec(lines[i]!)![0].length;
    const end = lines.findIndex((l, j) => j > i && /^\s*```\s*$/.test(l));
    expect(end, `${doc}:${i + 1}: a block that never closes`).toBeGreaterThan(i);
    const marker = /^\s*<!-- (.*) -->\s*$/.exec(lines[i - 1] ?? '')?.[1] ?? '';
    out.push({
      doc,
      line: i + 1,
      marker,
      text:
        lines
          .slice(i + 1, end)
          .map((l) => l.slice(indent))
          .join('\n') + '\n',
    });
    i = end;
  }
  return out;
}

/** Why a block cannot run here, or null. */
function unmet(marker: string): string | null {
  const needs = /^runnable: needs (.+)$/.exec(marker)?.[1];
  if (!needs) return null;
  for (const n of needs.split(/,\s*/)) {
    if (n === 'root' && !isRoot()) return 'needs root';
    if (n !== 'root' && !which(n)) return `needs ${n}, not installed`;
  }
  return null;
}

function portFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.once('error', () => resolve(false));
    s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)));
  });
}

/** One command that runs until stopped: SIGINT once it printed on stdout; its status and output. */
async function untilCtrlC(line: string, cwd: string, env: NodeJS.ProcessEnv): Promise<{ status: number | null; out: string }> {
  const child = spawn('sh', ['-c', `exec ${line}`], { cwd, env, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (out += d.toString()));
  let printed = false;
  child.stdout.once('data', () => (printed = true));
  const ended = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
  try {
    await waitFor(() => printed || child.exitCode !== null, `${line} to print its first line`, undefined, BLOCK_TIMEOUT_MS);
    child.kill('SIGINT');
    return { status: await ended, out };
  } finally {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  }
}

describe('the command blocks of the docs', () => {
  const blocks = DOCS.flatMap(shBlocks);
  let tarballBin = '';
  let work = '';
  let demo: DaemonChild | null = null;
  let demoSocket = '';

  beforeAll(async () => {
    work = tempDir('vmsr-doc-blocks-');
    if (which('npm')) {
      const tarball = packTarball(work);
      fs.mkdirSync(path.join(work, 'consumer'));
      installAsConsumer(tarball, path.join(work, 'consumer'));
      tarballBin = path.join(work, 'consumer/node_modules/.bin');
    }
    demo = spawnHelper(['demo', '--listen', '127.0.0.1:0']);
    await waitFor(() => /Ctrl-C/.test(demo!.stderr()), "the demo's banner", demo, 90_000);
    demoSocket = /socket (\/\S+\/vmsr\.sock)/.exec(demo.stderr())![1]!;
  }, 300_000);
  afterAll(async () => {
    await demo?.stop('SIGTERM');
    if (work) fs.rmSync(work, { recursive: true, force: true });
  });

  test('every sh block of the docs says whether it runs, and a block that does not says why', () => {
    expect(blocks.length).toBeGreaterThan(15);
    const bad = blocks.filter((b) => !/^(runnable(: (until Ctrl-C|beside the demo|needs .+))?|not runnable: .{10,})$/.test(b.marker));
    expect(
      bad.map((b) => `${b.doc}:${b.line}: ${b.marker || 'no marker'}`),
      'mark each block <!-- runnable... --> or <!-- not runnable: REASON -->',
    ).toEqual([]);
  });

  test('every runnable block runs as printed, in a clone and installed from the tarball', async () => {
    const ran: string[] = [];
    const skipped: string[] = [];
    // In the clone, vmsr-helper on PATH runs its dist/, as the README's alias makes it.
    const cloneBin = path.join(work, 'clone-bin');
    fs.mkdirSync(cloneBin);
    fs.symlinkSync(BIN, path.join(cloneBin, 'vmsr-helper'));
    const modes = [
      { name: 'clone', bin: cloneBin, inClone: true },
      ...(tarballBin ? [{ name: 'tarball', bin: tarballBin, inClone: false }] : []),
    ];
    if (!tarballBin) skipped.push('tarball mode: npm not installed');
    let n = 0;
    for (const mode of modes) {
      const env = { ...process.env, PATH: `${mode.bin}:${process.env.PATH}` };
      for (const b of blocks.filter((x) => x.marker.startsWith('runnable'))) {
        const where = `${b.doc}:${b.line} (${mode.name})`;
        const cloneOnly = (text: string) => !mode.inClone && text.includes('node dist/');
        const why = unmet(b.marker) ?? (b.marker !== 'runnable: until Ctrl-C' && cloneOnly(b.text) ? 'a clone only block' : null);
        if (why) {
          skipped.push(`${where}: ${why}`);
          continue;
        }
        // Each block in a fresh directory: in the clone mode, one holding this checkout's files (linked).
        const cwd = path.join(work, `run-${n++}`);
        fs.mkdirSync(cwd);
        if (mode.inClone) for (const e of fs.readdirSync(ROOT)) if (e !== '.git') fs.symlinkSync(path.join(ROOT, e), path.join(cwd, e));
        if (b.marker === 'runnable: until Ctrl-C') {
          for (const line of b.text.split('\n').map((l) => l.replace(/\s+#.*$/, '').trim())) {
            if (!line) continue;
            if (cloneOnly(line)) {
              skipped.push(`${where} ${line}: a clone only line`);
              continue;
            }
            if (/ demo$/.test(line) && !(await portFree(8677))) {
              skipped.push(`${where} ${line}: 127.0.0.1:8677, the demo's port, is in use by another process`);
              continue;
            }
            const r = await untilCtrlC(line, cwd, env);
            expect(r.status, `${where} ${line}\n${r.out}`).toBe(0);
            ran.push(`${where} ${line}`);
          }
          continue;
        }
        const text = b.marker === 'runnable: beside the demo' ? b.text.replaceAll(DEMO_DIR, path.dirname(demoSocket)) : b.text;
        const r = spawnSync('sh', ['-e', '-c', text], { cwd, env, encoding: 'utf8', timeout: BLOCK_TIMEOUT_MS });
        expect(r.status, `${where}\n${text}\n${r.stdout}${r.stderr}`).toBe(0);
        ran.push(where);
      }
    }
    console.log(
      `doc blocks: ran ${ran.length}, skipped ${skipped.length}\n  ran: ${ran.join('\n  ran: ')}${skipped.map((s) => `\n  skipped: ${s}`).join('')}`,
    );
    expect(ran.length).toBeGreaterThanOrEqual(5);
  }, 900_000);
});
