/**
 * docs/exporter.md's certificate and password recipe, run as it is written (H=localhost, the password
 * on stdin, `vmsr-helper` the built binary): the exporter serves TLS with what it made, under
 * node_exporter's flag names, and a scrape with the recipe's CA and the password gets the metrics.
 * Also `hash-password` itself: its hash verifies, its refusals name the fix.
 */
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import https from 'node:https';
import path from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { bcryptVerify } from '../../src/os/bcrypt.js';
import { BIN, ensureBuilt, ROOT, tempDir } from '../daemon/support/daemon-process.js';
import { MovingHost, startDaemon, startExporterChild, type ExporterChild } from './support/stack.js';

const PASSWORD = 'correct horse battery staple';

/** The sh block under the recipe's heading in docs/exporter.md. */
function recipe(): string {
  const doc = fs.readFileSync(path.join(ROOT, 'docs/exporter.md'), 'utf8');
  const at = doc.indexOf('### A certificate and a password, step by step');
  expect(at, 'the recipe heading in docs/exporter.md').toBeGreaterThan(0);
  return /```sh\n([\s\S]*?)```/.exec(doc.slice(at))![1]!;
}

/** A GET over TLS to 127.0.0.1 that checks the certificate against `ca` for the name localhost. */
function scrape(url: string, ca: string, auth?: string): Promise<{ status: number; body: string } | { error: string }> {
  return new Promise((resolve) => {
    const req = https.get(
      url,
      {
        agent: false,
        timeout: 10_000,
        ca: fs.readFileSync(ca),
        servername: 'localhost',
        headers: auth ? { authorization: `Basic ${Buffer.from(auth).toString('base64')}` } : {},
      },
      (res) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (d: string) => (body += d));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      },
    );
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', (e: NodeJS.ErrnoException) => resolve({ error: e.code ?? e.message }));
  });
}

const cleanups: (() => Promise<void> | void)[] = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

describe('the TLS recipe of docs/exporter.md', () => {
  test('the recipe makes a certificate and a web configuration the exporter serves TLS with, under --web.listen-address and --web.telemetry-path', async () => {
    ensureBuilt();
    const dir = tempDir('vmsr-recipe-');
    cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
    const script = recipe().replace(/^H=\S+/m, 'H=localhost');
    expect(script).toContain('vmsr-helper hash-password');
    // `vmsr-helper` as an installed host has it: the built binary.
    const shell = `vmsr-helper() { '${process.execPath}' '${BIN}' "$@"; }\nset -e\n${script}`;
    const run = spawnSync('bash', ['-c', shell], { cwd: dir, input: `${PASSWORD}\n`, encoding: 'utf8', timeout: 60_000 });
    expect(run.status, run.stderr).toBe(0);
    const config = fs.readFileSync(path.join(dir, 'web-config.yml'), 'utf8');
    const hash = /prometheus: (\S+)/.exec(config)![1]!;
    expect(hash).toMatch(/^\$2b\$10\$.{53}$/);
    expect(await bcryptVerify(PASSWORD, hash)).toBe(true);

    const host = new MovingHost();
    host.pump(50);
    cleanups.push(() => host.cleanup());
    const sock = path.join(dir, 'h.sock');
    const daemon = await startDaemon(host, sock);
    cleanups.push(async () => void (await daemon.stop()));
    const exporter: ExporterChild = await startExporterChild(sock, [
      '--web.config.file',
      path.join(dir, 'web-config.yml'),
      '--web.listen-address',
      '127.0.0.1:0',
      '--web.telemetry-path',
      '/vmsr/metrics',
    ]);
    cleanups.push(async () => void (await exporter.stop()));
    expect(exporter.url).toMatch(/^https:\/\/127\.0\.0\.1:\d+\/vmsr\/metrics$/);
    const ca = path.join(dir, 'ca.crt');
    const ok = await scrape(exporter.url, ca, `prometheus:${PASSWORD}`);
    expect('status' in ok ? ok.status : ok.error).toBe(200);
    expect('body' in ok ? ok.body : '').toMatch(/^vmsr_build_info\{/m);
    const wrong = await scrape(exporter.url, ca, 'prometheus:wrong');
    expect('status' in wrong ? wrong.status : wrong.error).toBe(401);
    const elsewhere = await scrape(exporter.url.replace('/vmsr/metrics', '/metrics'), ca, `prometheus:${PASSWORD}`);
    expect('status' in elsewhere ? elsewhere.status : elsewhere.error).toBe(404);
  }, 120_000);
});

describe('vmsr-helper hash-password', () => {
  test('hash-password refuses an empty password, one over 72 bytes and a cost below 4, naming why', () => {
    ensureBuilt();
    const hash = (input: string, args: string[] = []) =>
      spawnSync(process.execPath, [BIN, 'hash-password', ...args], { input, encoding: 'utf8', timeout: 30_000 });
    const empty = hash('\n');
    expect(empty.status).toBe(1);
    expect(empty.stderr).toContain('the password is empty');
    const long = hash(`${'x'.repeat(73)}\n`);
    expect(long.status).toBe(1);
    expect(long.stderr).toMatch(/cannot hash the password: it is longer than 72 bytes/);
    const cheap = hash('pw\n', ['--cost', '3']);
    expect(cheap.stderr).toMatch(/cost 3 is not an integer in 4\.\.16; give --cost 10/);
    const ok = execFileSync(process.execPath, [BIN, 'hash-password', '--cost', '4'], { input: 'pw', encoding: 'utf8' });
    expect(ok).toMatch(/^\$2b\$04\$.{53}\n$/);
  });

  test('hash-password on a terminal asks twice without echoing, and refuses two different passwords', async (ctx) => {
    ensureBuilt();
    if (spawnSync('sh', ['-c', 'command -v script']).status !== 0) return ctx.skip('no script(1) to give it a terminal (util-linux)');
    /** Runs it on a pseudo-terminal (script), typing each answer once its prompt shows. */
    const typed = (answers: string[]) =>
      new Promise<string>((resolve) => {
        const p = spawn('script', ['-qec', `'${process.execPath}' '${BIN}' hash-password --cost 4`, '/dev/null'], { stdio: 'pipe' });
        let out = '';
        const prompts = ['Password: ', 'Again: '];
        p.stdout.on('data', (d: Buffer) => {
          out += d.toString();
          while (prompts.length > 0 && out.includes(prompts[0]!)) {
            prompts.shift();
            p.stdin.write(`${answers.shift()}\r`);
          }
        });
        const t = setTimeout(() => p.kill(), 30_000);
        p.on('exit', () => (clearTimeout(t), resolve(out)));
      });
    const same = await typed([PASSWORD, PASSWORD]);
    expect(same).not.toContain(PASSWORD);
    const hash = /(\$2b\$04\$\S{53})/.exec(same)?.[1];
    expect(hash, same).toBeDefined();
    expect(await bcryptVerify(PASSWORD, hash!)).toBe(true);
    const differ = await typed([PASSWORD, 'another one']);
    expect(differ).toContain('the two passwords differ');
    expect(differ).not.toMatch(/\$2b\$/);
  }, 90_000);
});
