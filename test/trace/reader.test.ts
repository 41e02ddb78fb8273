/** The trace reader on good and hostile files: every error names its line, nothing hangs or crashes. */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import zlib from 'node:zlib';
import { afterAll, describe, expect, it } from 'vitest';
import { readTrace, readTraceStream } from '../../src/trace/reader.js';
import { TraceError, type TraceRecord } from '../../src/ratio/trace-records.js';
import { statLine } from '../ratio/helpers.js';

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-trace-reader-'));
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

const HEADER = {
  type: 'header',
  format: 'vmsr-trace',
  version: 1,
  clk_tck: 100,
  host: {
    vendor: 'intel',
    cpus: [
      { cpu: 0, package: 0 },
      { cpu: 1, package: 0 },
    ],
    packages: [{ package: 0, power_unit: '0xa0e03' }],
  },
  note: 'test',
};
const REGISTER = { type: 'register', t_ns: 1000, vm: { pid: 42, starttime: 7, name: 'vm', vcpus: [{ tid: 43, vpkg: 0 }] } };
const sampleRec = (t: number, extra: Record<string, unknown> = {}) => ({
  type: 'sample',
  t_ns: t,
  energy: { '0': '0x10' },
  tasks: { '42': { '42': statLine({ tid: 42, utime: 1, starttime: 7, processor: 0 }) } },
  ...extra,
});

function lines(...records: unknown[]): string {
  return records.map((r) => (typeof r === 'string' ? r : JSON.stringify(r))).join('\n') + '\n';
}

let n = 0;
function file(content: string | Buffer): string {
  const p = path.join(tmp, `t${n++}`);
  fs.writeFileSync(p, content);
  return p;
}

async function collect(it: AsyncIterable<TraceRecord>): Promise<TraceRecord[]> {
  const out: TraceRecord[] = [];
  for await (const r of it) out.push(r);
  return out;
}

async function errorOf(content: string | Buffer): Promise<TraceError> {
  try {
    await collect(readTrace(file(content)));
  } catch (e) {
    expect(e).toBeInstanceOf(TraceError);
    return e as TraceError;
  }
  throw new Error('expected the trace to be refused');
}

describe('trace reader: good traces', () => {
  it('reads header, register, sample and unregister into engine types; unknown keys are ignored', async () => {
    const recs = await collect(
      readTrace(
        file(lines({ ...HEADER, extra: [1] }, { ...REGISTER, why: 'x' }, sampleRec(2000), '', { type: 'unregister', t_ns: 3000, pid: 42 })),
      ),
    );
    expect(recs.map((r) => [r.type, r.line])).toEqual([
      ['header', 1],
      ['register', 2],
      ['sample', 3],
      ['unregister', 5],
    ]);
    const h = recs[0]!;
    expect(h.type === 'header' && h.header).toEqual({
      note: 'test',
      host: {
        vendor: 'intel',
        clkTck: 100,
        cpus: [
          { cpu: 0, pkg: 0 },
          { cpu: 1, pkg: 0 },
        ],
        packages: [{ pkg: 0, powerUnit: 0xa0e03n }],
      },
    });
    const s = recs[2]!;
    expect(s.type === 'sample' && s.sample.tNs).toBe(2000n);
    expect(s.type === 'sample' && s.sample.energy.get(0)).toBe(0x10n);
    expect(s.type === 'sample' && [...s.sample.tasks.get(42)!.keys()]).toEqual([42]);
  });

  it('keeps t_ns past 2^53 exact (a host up for more than 104 days)', async () => {
    const big = '9007199254740993123';
    const text = lines(HEADER, `{"type":"sample","t_ns":${big},"energy":{"0":"0x1"},"tasks":{}}`);
    const recs = await collect(readTrace(file(text)));
    expect(recs[1]!.type === 'sample' && recs[1]!.sample.tNs).toBe(BigInt(big));
  });

  it('accepts a last line without newline when it is a complete record', async () => {
    const recs = await collect(readTrace(file(lines(HEADER, sampleRec(1)).trimEnd())));
    expect(recs).toHaveLength(2);
  });

  it('reads gzip by its magic bytes whatever the name, including multi-member gzip', async () => {
    const gz = Buffer.concat([zlib.gzipSync(lines(HEADER)), zlib.gzipSync(lines(sampleRec(5)))]);
    expect(await collect(readTrace(file(gz)))).toHaveLength(2);
  });
});

describe('trace reader: errors name the line', () => {
  const cases: [string, string | Buffer, RegExp][] = [
    ['empty file', '', /no header: the trace is empty/],
    ['no header', lines(sampleRec(1)), /^line 1: the first record must be the header/],
    ['wrong format', lines({ ...HEADER, format: 'other' }), /^line 1: header: format must be "vmsr-trace"/],
    ['wrong version', lines({ ...HEADER, version: 2 }), /^line 1: header: unsupported version 2/],
    ['second header', lines(HEADER, sampleRec(1), HEADER), /^line 3: a second header/],
    ['unknown type', lines(HEADER, { type: 'reboot', t_ns: 5 }), /^line 2: unknown record type "reboot"/],
    ['bad JSON', lines(HEADER, '{"type":"sample",'), /^line 2: not valid JSON/],
    ['not an object', lines(HEADER, '[1,2]'), /^line 2: a record must be a JSON object/],
    ['missing t_ns', lines(HEADER, { type: 'sample', energy: {}, tasks: {} }), /^line 2: t_ns must be/],
    ['negative t_ns', lines(HEADER, sampleRec(-5)), /^line 2: t_ns must be/],
    ['non-monotonic samples', lines(HEADER, sampleRec(10), sampleRec(20), sampleRec(20)), /^line 4: sample t_ns 20 is not after/],
    ['record back in time', lines(HEADER, sampleRec(10), { ...REGISTER, t_ns: 5 }), /^line 3: t_ns 5 goes back in time/],
    ['energy not hex', lines(HEADER, sampleRec(1, { energy: { '0': 16 } })), /^line 2: energy\["0"\]: expected a hex string/],
    ['energy key not an id', lines(HEADER, sampleRec(1, { energy: { pkg0: '0x1' } })), /^line 2: energy: key "pkg0" is not a decimal id/],
    [
      'stat line not a string',
      lines(HEADER, sampleRec(1, { tasks: { '42': { '42': 5 } } })),
      /^line 2: sample: tasks\["42"\]\["42"\] must be a stat line string/,
    ],
    ['tasks missing', lines(HEADER, { type: 'sample', t_ns: 1, energy: {} }), /^line 2: sample: tasks must be an object/],
    [
      'vpkg out of range',
      lines(HEADER, { ...REGISTER, vm: { ...REGISTER.vm, vcpus: [{ tid: 43, vpkg: 300 }] } }),
      /^line 2: register: vCPU 1: virtual package 300 is out of range \(0..255\)$/,
    ],
    ['pid zero', lines(HEADER, { type: 'unregister', t_ns: 1, pid: 0 }), /^line 2: pid must be a positive integer/],
    ['vendor', lines({ ...HEADER, host: { ...HEADER.host, vendor: 'via' } }), /^line 1: header: host.vendor/],
    [
      'cpu in unlisted package',
      lines({ ...HEADER, host: { ...HEADER.host, cpus: [{ cpu: 0, package: 9 }] } }),
      /^line 1: header: cpu 0 is in package 9/,
    ],
    ['clk_tck', lines({ ...HEADER, clk_tck: 0 }), /^line 1: header: clk_tck must be a positive integer/],
    [
      'truncated last line',
      lines(HEADER, sampleRec(1)) + '{"type":"sample","t_ns":2,"ener',
      /^line 3: truncated: the last line ends without a newline/,
    ],
    ['invalid UTF-8', Buffer.concat([Buffer.from(lines(HEADER)), Buffer.from([0x7b, 0xff, 0xfe, 0x7d, 0x0a])]), /^line 2: not valid UTF-8/],
  ];
  for (const [name, content, message] of cases) {
    it(name, async () => {
      const e = await errorOf(content);
      expect(`line ${e.line}: ${e.reason}`).toMatch(message);
      expect(e.message.startsWith(`${e.file}: `)).toBe(true); // the file is named
    });
  }

  it('truncated gzip names the line it got to', async () => {
    const whole = zlib.gzipSync(lines(HEADER, sampleRec(1), sampleRec(2), sampleRec(3)));
    const e = await errorOf(whole.subarray(0, whole.length - 12));
    expect(e.message).toMatch(/^\/.*: line \d+: gzip data is truncated or corrupt/);
  });

  it('corrupt gzip after the magic bytes', async () => {
    const e = await errorOf(Buffer.from([0x1f, 0x8b, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]));
    expect(e.message).toMatch(/gzip data is truncated or corrupt/);
  });

  it('a missing file or a directory is a clear error', async () => {
    await expect(collect(readTrace(path.join(tmp, 'nope.jsonl')))).rejects.toThrow(/cannot read trace .*nope.jsonl: ENOENT/);
    await expect(collect(readTrace(tmp))).rejects.toThrow(/is a directory/);
  });

  it('caps the line length: a line past the cap is refused without reading the rest', async () => {
    const e = await collect(readTrace(file(lines(HEADER) + 'x'.repeat(5000) + '\n'), { maxLineBytes: 1024 })).catch((err: unknown) => err);
    expect((e as Error).message).toMatch(/: line 2: line longer than 1024 bytes/);
  });

  it('an endless line (a stream of 1 GB without newline) stops at the default cap', async () => {
    let produced = 0;
    async function* endless(): AsyncGenerator<Buffer> {
      yield Buffer.from(lines(HEADER));
      const chunk = Buffer.alloc(1 << 20, 0x20);
      for (let i = 0; i < 1024; i++) {
        produced += chunk.length;
        yield chunk;
      }
    }
    const e = await collect(readTraceStream(endless())).catch((err: unknown) => err);
    expect((e as Error).message).toMatch(/^line 2: line longer than 33554432 bytes/);
    expect(produced).toBeLessThan(40 << 20);
  });

  it('a gzip bomb of one huge line is refused at the cap while streaming', async () => {
    const bomb = zlib.gzipSync(Buffer.concat([Buffer.from(lines(HEADER)), Buffer.alloc(64 << 20, 0x61)]));
    const e = await errorOf(bomb);
    expect(e.message).toMatch(/: line 2: line longer than/);
  });

  it('skips blank and whitespace-only lines fast, and counts them in line numbers', async () => {
    const blanks = '\n'.repeat(900_000) + ' \t\r\n'.repeat(1000);
    const t = Date.now();
    const recs = await collect(readTrace(file(lines(HEADER) + blanks + lines(sampleRec(1)) + '\n\n')));
    // Linear, not per-line work that grows with the file: far under what a quadratic skip takes (the speed is bench's).
    expect(Date.now() - t, 'reading 900,000 blank lines (a busy machine included)').toBeLessThan(30_000);
    expect(recs.map((r) => [r.type, r.line])).toEqual([
      ['header', 1],
      ['sample', 901_002],
    ]);
  });

  it('reports progress (lines and file bytes) while scanning', async () => {
    const seen: { lines: number; fileBytes?: number }[] = [];
    for await (const _ of readTrace(file(lines(HEADER) + '\n'.repeat(500_000) + lines(sampleRec(1))), { onProgress: (p) => seen.push(p) }))
      void _;
    expect(seen.length).toBeGreaterThan(3);
    expect(seen.at(-1)!.lines).toBeGreaterThan(100_000);
    expect(seen.at(-1)!.fileBytes).toBeGreaterThan(100_000);
  });

  it('refuses JSON nested deeper than any record before parsing it', async () => {
    const e = await errorOf(lines(HEADER) + '{"a":'.repeat(100) + '1' + '}'.repeat(100) + '\n');
    expect(e.message).toMatch(/: line 2: JSON nested more than 32 levels deep/);
    // brackets inside strings do not count
    const ok = await collect(readTrace(file(lines(HEADER, { type: 'unregister', t_ns: 1, pid: 5, note: '[[[['.repeat(50) }))));
    expect(ok).toHaveLength(2);
  });
});
