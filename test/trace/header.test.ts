/** The trace header's wall-clock start and host name; older traces without them; VM names and end states. */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { readTrace, replayFile } from '../../src/trace/reader.js';
import { TraceError, type TraceRecord } from '../../src/ratio/trace-records.js';
import { TraceWriter } from '../../src/trace/writer.js';
import { formatTable, stateOf, totalJsonLine } from '../../src/ratio/replay-report.js';
import { qemuNameFromCmdline } from '../../src/discovery/qemu-name.js';
import type { HostInfo } from '../../src/model/host.js';

const OLD_TRACE = path.resolve(import.meta.dirname, '../fixtures/traces/three-vms.jsonl');

const cleanups: (() => unknown)[] = [];
afterEach(() => {
  for (const c of cleanups.splice(0)) c();
});

function tmpFile(name: string): string {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-header-'));
  cleanups.push(() => fs.rmSync(d, { recursive: true, force: true }));
  return path.join(d, name);
}

async function records(file: string): Promise<TraceRecord[]> {
  const out: TraceRecord[] = [];
  for await (const r of readTrace(file)) out.push(r);
  return out;
}

const host: HostInfo = { vendor: 'intel', clkTck: 100, cpus: [{ cpu: 0, pkg: 0 }], packages: [{ pkg: 0, powerUnit: 0xa0e03n }] };

function headerText(extra: string): string {
  return `{"type":"header","format":"vmsr-trace","version":1,"clk_tck":100,"host":{"vendor":"intel","cpus":[{"cpu":0,"package":0}],"packages":[{"package":0,"power_unit":"0xa0e03"}]}${extra}}\n`;
}

describe('trace header', () => {
  test('a new trace records its wall-clock start, the monotonic time of that moment and the host name', async () => {
    const f = tmpFile('t.jsonl');
    const before = Date.now();
    const monoBefore = process.hrtime.bigint();
    const w = TraceWriter.open(f, { host, note: 'n' });
    await w.close();
    const [h] = await records(f);
    if (h?.type !== 'header') throw new Error('no header');
    expect(h.header.hostname).toBe(os.hostname());
    const t = Date.parse(h.header.startTime!);
    expect(t).toBeGreaterThanOrEqual(before - 1);
    expect(t).toBeLessThanOrEqual(Date.now());
    expect(h.header.startNs).toBeGreaterThanOrEqual(monoBefore);
    expect(h.header.startNs).toBeLessThanOrEqual(process.hrtime.bigint());
    const line = JSON.parse(fs.readFileSync(f, 'utf8').split('\n')[0]!) as Record<string, unknown>;
    expect(Object.keys(line)).toEqual(expect.arrayContaining(['start_time', 'start_t_ns', 'hostname']));
  });

  test('an older trace without them still reads and replays (the bundled test trace has none)', async () => {
    const [h] = await records(OLD_TRACE);
    if (h?.type !== 'header') throw new Error('no header');
    expect(h.header.startTime).toBeUndefined();
    expect(h.header.hostname).toBeUndefined();
    const s = await replayFile(OLD_TRACE);
    expect(s.vms.length).toBeGreaterThan(0);
    expect(formatTable(s)).not.toContain('recorded on');
  });

  test('start_t_ns past 2^53 keeps every digit; the table shows host and start', async () => {
    const f = tmpFile('big.jsonl');
    fs.writeFileSync(f, headerText(',"start_time":"2026-11-22T01:00:00.000Z","start_t_ns":9007199254740993,"hostname":"kvm-7"'));
    const [h] = await records(f);
    if (h?.type !== 'header') throw new Error('no header');
    expect(h.header.startNs).toBe(9007199254740993n);
    expect(formatTable(await replayFile(f))).toContain('recorded on kvm-7 from 2026-11-22T01:00:00.000Z');
  });

  test('a hostile start_time or hostname is refused with its line', async () => {
    for (const [extra, re] of [
      [',"start_time":"yesterday"', /line 1: header: start_time must be an ISO 8601 time/],
      [',"start_time":12', /start_time must be an ISO 8601 time/],
      [',"hostname":"a\\u001b[2Jb"', /line 1: header: hostname must be a host name of 1\.\.253 printable characters/],
      [`,"hostname":"${'h'.repeat(300)}"`, /hostname must be a host name/],
      [',"start_t_ns":-1', /start_t_ns must be a non-negative integer/],
    ] as const) {
      const f = tmpFile('bad.jsonl');
      fs.writeFileSync(f, headerText(extra));
      await expect(records(f)).rejects.toThrow(TraceError);
      await expect(records(f)).rejects.toThrow(re);
    }
  });
});

describe('VM names and end states in replay', () => {
  test('a VM unregistered while its process runs is "unregistered", one whose process went is "ended"; names come from the trace', async () => {
    const f = tmpFile('states.jsonl');
    const stat = (pid: number, ticks: number) =>
      `${pid} (qemu) R 1 1 1 0 -1 0 0 0 0 0 ${ticks} 0 0 0 20 0 1 0 5000 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0`;
    const sample = (t: number, e: number, pids: number[], ticks: number) =>
      `{"type":"sample","t_ns":${t},"energy":{"0":"0x${e.toString(16)}"},"tasks":{${pids.map((p) => `"${p}":{"${p}":"${stat(p, ticks)}"}`).join(',')}}}\n`;
    fs.writeFileSync(
      f,
      headerText('') +
        '{"type":"register","t_ns":1,"vm":{"pid":101,"starttime":5000,"name":"vm-gone","vcpus":[{"tid":101,"vpkg":0}]}}\n' +
        '{"type":"register","t_ns":1,"vm":{"pid":102,"starttime":5000,"vcpus":[{"tid":102,"vpkg":0}]}}\n' +
        '{"type":"register","t_ns":1,"vm":{"pid":103,"starttime":5000,"name":"vm-on","vcpus":[{"tid":103,"vpkg":0}]}}\n' +
        sample(1e9, 0, [101, 102, 103], 10) +
        sample(2e9, 16384, [101, 102, 103], 20) +
        '{"type":"unregister","t_ns":2500000000,"pid":102}\n' +
        sample(3e9, 32768, [102, 103], 30),
    );
    const s = await replayFile(f);
    expect(s.vms.map((v) => [v.output.name ?? null, stateOf(v.output)])).toEqual([
      ['vm-gone', 'ended'],
      [null, 'unregistered'],
      ['vm-on', 'running'],
    ]);
    const table = formatTable(s);
    expect(table).toMatch(/vm-gone +101 +ended/);
    expect(table).toMatch(/\(unnamed\) +102 +unregistered/);
    // replay --json keeps its format: both are "ended": true, as before.
    const total = JSON.parse(totalJsonLine(s.vms.map((v) => v.output))) as { vms: { ended: boolean }[] };
    expect(total.vms.map((v) => v.ended)).toEqual([true, true, false]);
  });

  test('QEMU -name is read from a command line: plain, guest=, with escaped commas; hostile ones give none', () => {
    const cl = (...a: string[]) => a.join('\0') + '\0';
    expect(qemuNameFromCmdline(cl('qemu-system-x86_64', '-name', 'vm-a'))).toBe('vm-a');
    expect(qemuNameFromCmdline(cl('qemu', '-name', 'guest=instance-0001,debug-threads=on'))).toBe('instance-0001');
    expect(qemuNameFromCmdline(cl('qemu', '-name', 'web,,db,debug-threads=on'))).toBe('web,db');
    expect(qemuNameFromCmdline(cl('qemu', '--name', 'debug-threads=on,guest=x'))).toBe('x');
    expect(qemuNameFromCmdline(cl('qemu', '-m', '512'))).toBeUndefined();
    expect(qemuNameFromCmdline(cl('qemu', '-name'))).toBeUndefined();
    expect(qemuNameFromCmdline(cl('qemu', '-name', 'debug-threads=on'))).toBeUndefined();
    expect(qemuNameFromCmdline(cl('qemu', '-name', 'a\u001b[2Jb'))).toBeUndefined();
    expect(qemuNameFromCmdline(cl('qemu', '-name', 'x'.repeat(300)))).toBeUndefined();
  });
});
