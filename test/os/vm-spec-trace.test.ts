import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import zlib from 'node:zlib';
import { afterEach, describe, expect, test } from 'vitest';
import { vmSpecFromArgs } from '../../src/os/vm-threads.js';
import { parseVcpuList } from '../../src/model/vcpus.js';
import { readStarttime } from '../../src/os/proc-starttime.js';
import { TraceWriter } from '../../src/trace/writer.js';
import type { HostInfo } from '../../src/model/host.js';
import { parseStatLine } from '../../src/ratio/stat.js';
import { ThreadedProcess } from '../support/threads.js';

describe('parseVcpuList', () => {
  test('accepts TID:VPKG lists', () => {
    expect(parseVcpuList('4250:0,4251:1')).toEqual([
      { tid: 4250, vpkg: 0 },
      { tid: 4251, vpkg: 1 },
    ]);
    expect(parseVcpuList(' 7:255 ')).toEqual([{ tid: 7, vpkg: 255 }]);
  });
  test.each([
    ['', /empty/],
    ['4250', /^vCPU 1 .*TID:VPKG/],
    ['4250:0,', /^vCPU 2 /],
    ['4250:0,4250:1', /listed twice/],
    ['4250:256', /out of range/],
    ['0:0', /out of range/],
    ['4294967296:0', /out of range|TID:VPKG/],
    ['-1:0', /TID:VPKG/],
    ['12:0x1', /TID:VPKG/],
    ['1:1;2:2', /TID:VPKG/],
  ])('rejects %j', (text, re) => {
    expect(() => parseVcpuList(text)).toThrow(re);
  });
  test('rejects more than 4096 entries', () => {
    const many = Array.from({ length: 4097 }, (_, i) => `${i + 1}:0`).join(',');
    expect(() => parseVcpuList(many)).toThrow(/at most 4096/);
  });
});

describe('VmSpec from a real process', () => {
  const procs: ThreadedProcess[] = [];
  afterEach(async () => {
    for (const p of procs.splice(0)) await p.kill();
  });

  test('starttime is stat field 22; threads must belong to the pid', async () => {
    const p = new ThreadedProcess();
    procs.push(p);
    await p.ready();
    await p.cmd('start 2');
    const parsed = parseStatLine(fs.readFileSync(`/proc/${p.pid}/stat`, 'latin1').trimEnd());
    if (!parsed.ok) throw new Error(parsed.error);
    const st = parsed.value;
    expect(readStarttime('/proc', p.pid)).toBe(st.starttime);
    expect(readStarttime('/proc', 0x7ffffffe)).toBeNull();
    const [, t1, t2] = p.tids();
    const spec = vmSpecFromArgs(
      '/proc',
      p.pid,
      [
        { tid: t1!, vpkg: 0 },
        { tid: t2!, vpkg: 1 },
      ],
      'x',
    );
    expect(spec).toEqual({
      pid: p.pid,
      starttime: st.starttime,
      name: 'x',
      vcpus: [
        { tid: t1, vpkg: 0 },
        { tid: t2, vpkg: 1 },
      ],
    });
    expect(() => vmSpecFromArgs('/proc', p.pid, [{ tid: process.pid, vpkg: 0 }])).toThrow(
      `belongs to process ${process.pid}, not ${p.pid}`,
    );
    expect(() => vmSpecFromArgs('/proc', 0x7ffffffe, [])).toThrow(/does not exist/);
  });
});

const host: HostInfo = {
  vendor: 'intel',
  clkTck: 100,
  cpus: [
    { cpu: 0, pkg: 0 },
    { cpu: 1, pkg: 1 },
  ],
  packages: [
    { pkg: 0, powerUnit: 0xa0e03n, powerLimit: 0x42817000fe8078n, powerInfo: 0x1e0n },
    { pkg: 1, powerUnit: 0xa0e03n },
  ],
};

describe('TraceWriter', () => {
  const dirs: string[] = [];
  afterEach(() => {
    for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true });
  });
  const tmp = () => {
    const d = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-trace-'));
    dirs.push(d);
    return d;
  };

  async function writeSome(file: string): Promise<TraceWriter> {
    const w = TraceWriter.open(file, { host, note: 'test "quoted" note' });
    w.register(1000n, {
      pid: 4242,
      starttime: 123456,
      name: 'vm-a',
      vcpus: [
        { tid: 4250, vpkg: 0 },
        { tid: 4251, vpkg: 1 },
      ],
    });
    const weird = '4250 (CPU 0/KVM) R 1 2 3'; // any text survives JSON escaping
    w.sample({
      tNs: 2_000_000_000n,
      energy: new Map([
        [0, 0xfffff000n],
        [1, 0xffff_ffff_ffff_ffffn],
      ]),
      tasks: new Map([
        [
          4242,
          new Map([
            [4242, '4242 (a) b\\"c) S'],
            [4250, weird],
          ]),
        ],
      ]),
    });
    w.sample({
      tNs: 9_007_199_254_740_993n,
      energy: new Map([
        [0, 1n],
        [1, 2n],
      ]),
      tasks: new Map(),
    });
    w.unregister(9_007_199_254_740_994n, 4242);
    await w.close();
    return w;
  }

  function check(text: string): void {
    const lines = text.split('\n');
    expect(lines.pop()).toBe('');
    const recs = lines.map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(recs.map((r) => r.type)).toEqual(['header', 'register', 'sample', 'sample', 'unregister']);
    expect(recs[0]).toEqual({
      type: 'header',
      format: 'vmsr-trace',
      version: 1,
      clk_tck: 100,
      host: {
        vendor: 'intel',
        cpus: [
          { cpu: 0, package: 0 },
          { cpu: 1, package: 1 },
        ],
        packages: [
          { package: 0, power_unit: '0xa0e03', power_limit: '0x42817000fe8078', power_info: '0x1e0' },
          { package: 1, power_unit: '0xa0e03' },
        ],
      },
      note: 'test "quoted" note',
      // Added by the writer: when and where the recording started.
      start_time: expect.stringMatching(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/),
      start_t_ns: expect.any(Number),
      hostname: os.hostname(),
    });
    expect(recs[1]).toEqual({
      type: 'register',
      t_ns: 1000,
      vm: {
        pid: 4242,
        starttime: 123456,
        name: 'vm-a',
        vcpus: [
          { tid: 4250, vpkg: 0 },
          { tid: 4251, vpkg: 1 },
        ],
      },
    });
    expect(recs[2]).toEqual({
      type: 'sample',
      t_ns: 2e9,
      energy: { 0: '0xfffff000', 1: '0xffffffffffffffff' },
      tasks: { 4242: { 4242: '4242 (a) b\\"c) S', 4250: '4250 (CPU 0/KVM) R 1 2 3' } },
    });
    // t_ns beyond 2^53 is written exactly (the text keeps every digit)
    expect(lines[3]).toContain('"t_ns":9007199254740993,');
    expect(lines[4]).toBe('{"type":"unregister","t_ns":9007199254740994,"pid":4242}');
  }

  test('plain JSON Lines per the format', async () => {
    const f = path.join(tmp(), 't.jsonl');
    const w = await writeSome(f);
    check(fs.readFileSync(f, 'utf8'));
    expect(fs.readFileSync(f, 'utf8').split('\n')).toHaveLength(6); // 5 records, each ending in a newline
    expect(w.bytesWritten).toBe(fs.statSync(f).size);
  });

  test('gzip round trip', async () => {
    const f = path.join(tmp(), 't.jsonl.gz');
    await writeSome(f);
    check(zlib.gunzipSync(fs.readFileSync(f)).toString('utf8'));
  });

  test('samples must move forward; writes after close throw; bad path throws at open', async () => {
    const f = path.join(tmp(), 't.jsonl');
    const w = TraceWriter.open(f, { host, note: '' });
    w.sample({ tNs: 5n, energy: new Map(), tasks: new Map() });
    expect(() => w.sample({ tNs: 5n, energy: new Map(), tasks: new Map() })).toThrow(/increase/);
    await w.close();
    await w.close();
    expect(() => w.unregister(6n, 1)).toThrow(/closed/);
    expect(() => TraceWriter.open('/nonexistent-dir/x.jsonl', { host, note: '' })).toThrow(/ENOENT/);
  });

  test('a full disk (ENOSPC) pauses the writer, samples are dropped, and close() rejects naming the loss instead of hanging', async (ctx) => {
    if (!fs.existsSync('/dev/full')) return ctx.skip('no /dev/full');
    const events = { paused: [] as string[], resumed: 0 };
    const w = TraceWriter.open(
      '/dev/full',
      { host, note: '' },
      { overwrite: true, events: { paused: (why) => events.paused.push(why), resumed: () => events.resumed++ } },
    );
    expect(events.paused).toEqual(['ENOSPC']);
    for (let t = 1n; t <= 3n; t++) w.sample({ tNs: t, energy: new Map(), tasks: new Map() });
    expect(w.lostSamples).toBe(3);
    expect(events).toEqual({ paused: ['ENOSPC'], resumed: 0 });
    await expect(w.close()).rejects.toThrow(
      /cannot write the end of trace \/dev\/full: the disk is still full; .*3 samples after it were lost/,
    );
  });
});
