/** The real `vmsr-helper replay` command as a child process (the built dist/, as `npm test` builds it). */
import { spawn, spawnSync } from 'node:child_process';
import zlib from 'node:zlib';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it, type TestContext } from 'vitest';
import { generateTraceLines } from '../../bench/replay.js';
import { replayFile } from '../../src/trace/reader.js';
import { intervalJsonLine, totalJsonLine } from '../../src/ratio/replay-report.js';
import { statLine } from './helpers.js';

const ROOT = path.resolve(import.meta.dirname, '../..');
const BIN = path.join(ROOT, 'dist/src/bin/vmsr-helper.js');
const FIXTURE = path.join(ROOT, 'test/fixtures/traces/three-vms.jsonl');
const BUNDLED = path.join(ROOT, 'traces/qemu-spin-vs-idle.jsonl.gz');

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-replay-cli-'));
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

function needBuild(ctx: TestContext): void {
  if (!fs.existsSync(BIN)) ctx.skip('dist/ is not built: run `npm run build` (npm test does it first)');
}

function cli(...args: string[]) {
  return spawnSync(process.execPath, [BIN, ...args], { cwd: tmp, encoding: 'utf8', timeout: 30_000 });
}

const HEADER =
  '{"type":"header","format":"vmsr-trace","version":1,"clk_tck":100,"host":{"vendor":"intel","cpus":[{"cpu":0,"package":0}],"packages":[{"package":0,"power_unit":"0xa0e03"}]}}';

describe('vmsr-helper replay (child process)', () => {
  it('--json prints the same lines as the in-process replay, which match the expected file', async (ctx) => {
    needBuild(ctx);
    const r = cli('replay', FIXTURE, '--json');
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
    const lines: string[] = [];
    const summary = await replayFile(FIXTURE, (x) => lines.push(intervalJsonLine(x)));
    lines.push(totalJsonLine(summary.vms.map((v) => v.output)));
    expect(r.stdout).toBe(lines.join('\n') + '\n');
    const total = JSON.parse(r.stdout.trim().split('\n').at(-1)!) as { vms: { name: string; vpkgs: { energy_uj: string }[] }[] };
    expect(total.vms[0]).toMatchObject({ name: 'vm-a', vpkgs: [{ energy_uj: '669107527' }, { energy_uj: '646510435' }] });
  });

  it('prints a table per VM and virtual package with joules, average watts and ended', (ctx) => {
    needBuild(ctx);
    const r = cli('replay', FIXTURE);
    expect(r.status).toBe(0);
    const rows = r.stdout.split('\n');
    expect(rows[0]).toMatch(/^40 samples, 39 intervals/);
    expect(rows[1]).toMatch(/^VM\s+PID\s+STATE\s+VPKG\s+JOULES\s+AVG W\s+OVER S$/);
    expect(rows.find((l) => l.startsWith('vm-a') && /\s0\s+669\.108\s/.test(l))).toBeDefined();
    expect(rows.find((l) => l.startsWith('vm-b'))).toMatch(/ended\s+0\s+376\.999\s+13\.43/);
  });

  it('a broken trace: exit 1, one line naming the file line, no stack trace', (ctx) => {
    needBuild(ctx);
    const bad = path.join(tmp, 'bad.jsonl');
    fs.writeFileSync(bad, `${HEADER}\n{"type":"sample","t_ns":5,"energy":{"0":"0x1"},"tasks":{}}\n{"type":"bogus"}\n`);
    const r = cli('replay', bad, '--json');
    expect(r.status).toBe(1);
    expect(r.stderr).toBe(`vmsr-helper replay: ${bad}: line 3: unknown record type "bogus"\n`);
    const missing = cli('replay', path.join(tmp, 'none.jsonl'));
    expect(missing.status).toBe(1);
    expect(missing.stderr).toMatch(/^vmsr-helper replay: cannot read trace .*none\.jsonl: ENOENT/);
    expect(missing.stderr).not.toMatch(/\n\s+at /);
  });

  it('stat lines the engine cannot parse are counted on stderr, the replay goes on', (ctx) => {
    needBuild(ctx);
    const t = path.join(tmp, 'problems.jsonl');
    const ok = (ticks: number) => JSON.stringify(statLine({ tid: 11, comm: 'q) 1 (x y', utime: ticks, starttime: 3, processor: 0 }));
    const lines = [
      HEADER,
      '{"type":"register","t_ns":1,"vm":{"pid":10,"starttime":3,"name":"v","vcpus":[{"tid":11,"vpkg":0}]}}',
      `{"type":"sample","t_ns":1000000000,"energy":{"0":"0x0"},"tasks":{"10":{"11":${ok(0)},"12":"12 (bro"}}}`,
      `{"type":"sample","t_ns":2000000000,"energy":{"0":"0x40000"},"tasks":{"10":{"11":${ok(50)},"12":"garbage"}}}`,
    ];
    fs.writeFileSync(t, lines.join('\n') + '\n');
    const r = cli('replay', t, '--json');
    expect(r.status).toBe(0);
    expect(r.stderr).toMatch(
      /^2 problem\(s\) in the trace were skipped \(not fatal\):\n {2}line 3: pid 10 tid 12: stat line not understood/,
    );
    // 0x40000 units = 16 J; 50 of 100 ticks (1 CPU, 1 s) -> 8 J for the vCPU named "q) 1 (x y".
    const interval = JSON.parse(r.stdout.split('\n')[0]!) as { vms: { vpkgs: { energy_j: number }[] }[] };
    expect(interval.vms[0]!.vpkgs[0]!.energy_j).toBe(8);
  });

  it('without TRACE it replays the bundled trace', (ctx) => {
    needBuild(ctx);
    // The trace is committed (traces/README.md): its absence is a packaging bug, not a reason to pass.
    expect(fs.existsSync(BUNDLED)).toBe(true);
    const r = cli('replay');
    expect(r.stderr).not.toMatch(/vmsr-helper:/);
    expect(r.status).toBe(0);
    expect(r.stdout).toMatch(/samples, \d+ intervals/);
    expect(r.stdout).toMatch(/^vm-spin .* running /m);
    expect(r.stdout).toMatch(/^vm-idle .* running /m);
    expect(r.stdout).toMatch(/^vm-boot .* ended /m);
  });

  it('--json into a pipe closed early ends quietly (EPIPE), no stack trace', async (ctx) => {
    needBuild(ctx);
    const big = path.join(tmp, 'big.jsonl');
    fs.writeFileSync(big, [...generateTraceLines({ vms: 5, threadsPerVm: 4, samples: 3000 })].join('\n') + '\n');
    const child = spawn(process.execPath, [BIN, 'replay', big, '--json'], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    await new Promise<void>((resolve) => child.stdout.once('data', () => resolve()));
    child.stdout.destroy();
    const code = await new Promise<number | null>((resolve) => child.on('close', (c) => resolve(c)));
    expect(stderr).toBe('');
    // 141: 128 + SIGPIPE, what a shell shows for `cat` into a closed pipe (src/cli/cli.ts).
    expect(code).toBe(141);
  });
});

describe('vmsr-helper replay of hostile input (child process)', () => {
  const replay = (file: string) => {
    const t = Date.now();
    const r = cli('replay', file, '--json');
    return { ...r, ms: Date.now() - t };
  };

  it('a 1 MB gzip of blank lines: refused with file and line in bounded time', (ctx) => {
    needBuild(ctx);
    const file = path.join(tmp, 'blank.jsonl.gz');
    // ~1 GB of newlines compresses to ~1 MB
    const gz = zlib.createGzip({ level: 9 });
    const out: Buffer[] = [];
    gz.on('data', (d: Buffer) => out.push(d));
    const mb = Buffer.alloc(1 << 20, 10);
    for (let i = 0; i < 1000; i++) gz.write(mb);
    gz.end();
    return new Promise<void>((resolve, reject) =>
      gz.on('end', () => {
        try {
          fs.writeFileSync(file, Buffer.concat(out));
          const r = replay(file);
          expect(r.status).toBe(1);
          expect(r.stderr).toBe(
            `vmsr-helper replay: ${file}: line 1000001: more than 1000000 blank lines in a row: not a trace (a recorder never writes blank lines)\n`,
          );
          expect(r.ms).toBeLessThan(10_000);
          resolve();
        } catch (e) {
          reject(e);
        }
      }),
    );
  });

  it('a 5-million-deep JSON line: one line naming file and line, no stack overflow', (ctx) => {
    needBuild(ctx);
    const file = path.join(tmp, 'deep.jsonl');
    fs.writeFileSync(file, `${HEADER}\n${'['.repeat(5_000_000)}\n`);
    const r = replay(file);
    expect(r.status).toBe(1);
    expect(r.stderr).toBe(`vmsr-helper replay: ${file}: line 2: JSON nested more than 32 levels deep: not a trace record\n`);
  });

  it('a .gz that is not gzip says so', (ctx) => {
    needBuild(ctx);
    const file = path.join(tmp, 'fake.jsonl.gz');
    fs.writeFileSync(file, Buffer.from([0x50, 0x4b, 0x03, 0x04, 0xff, 0xfe]));
    const r = replay(file);
    expect(r.status).toBe(1);
    expect(r.stderr).toBe(
      `vmsr-helper replay: ${file}: not gzip: the name ends in .gz but the file starts with 50 4b, not the gzip magic 1f 8b; is it truncated or mis-named?\n`,
    );
  });

  it('a truncated gzip: the error names the file', (ctx) => {
    needBuild(ctx);
    const file = path.join(tmp, 'cut.jsonl.gz');
    const whole = fs.readFileSync(FIXTURE);
    const gz = zlib.gzipSync(whole);
    fs.writeFileSync(file, gz.subarray(0, Math.floor(gz.length / 2)));
    const r = replay(file);
    expect(r.status).toBe(1);
    expect(r.stderr).toMatch(
      new RegExp(
        `^vmsr-helper replay: ${file.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}: line \\d+: gzip data is truncated or corrupt \\(unexpected end of file\\)\\n$`,
      ),
    );
  });
});
