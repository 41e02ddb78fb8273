/**
 * The vCPU-list rule is written once (src/model/vcpus.ts); every way a VM arrives applies it, so the
 * same bad list gets the same answer from the v2 parser, the --vcpus parser, the trace reader and
 * the engine.
 */
import { describe, expect, test } from 'vitest';
import { checkVcpus, parseVcpuList, MAX_TID, type VcpuSpec } from '../../src/model/vcpus.js';
import { parseClientFrame } from '../../src/protocol/v2/messages.js';
import { TraceParser } from '../../src/trace/reader.js';
import { RatioEngine } from '../../src/ratio/attribution.js';
import { host } from './helpers.js';

/** A REGISTER payload written field by field (u32 pid, u32 nvcpu, then u32 tid, u32 vpkg each), not by our encoder. */
function registerPayload(pid: number, vcpus: VcpuSpec[]): Buffer {
  const b = Buffer.alloc(8 + 8 * vcpus.length);
  b.writeUInt32LE(pid, 0);
  b.writeUInt32LE(vcpus.length, 4);
  vcpus.forEach((v, i) => {
    b.writeUInt32LE(v.tid, 8 + 8 * i);
    b.writeUInt32LE(v.vpkg, 12 + 8 * i);
  });
  return b;
}

const HEADER = JSON.stringify({
  type: 'header',
  format: 'vmsr-trace',
  version: 1,
  clk_tck: 100,
  host: {
    vendor: 'intel',
    packages: [{ package: 0, power_unit: '0xa0e03', power_limit: '0x0', power_info: '0x0' }],
    cpus: [{ cpu: 0, package: 0 }],
  },
});

/** The message each entry point gives for one list, without its own prefix. */
function answers(vcpus: VcpuSpec[]): Record<string, string> {
  const out: Record<string, string> = {};
  const rule = checkVcpus(vcpus);
  out.rule = rule.ok ? 'ok' : rule.error;
  const v2 = parseClientFrame({ type: 0x01, flags: 0, payload: registerPayload(100, vcpus) });
  out.v2 = v2.ok ? 'ok' : v2.error.message;
  try {
    parseVcpuList(vcpus.map((v) => `${v.tid}:${v.vpkg}`).join(','));
    out.cli = 'ok';
  } catch (e) {
    out.cli = (e as Error).message;
  }
  const parser = new TraceParser();
  parser.line(HEADER, 1);
  try {
    parser.line(JSON.stringify({ type: 'register', t_ns: 1, vm: { pid: 100, starttime: 1, vcpus } }), 2);
    out.trace = 'ok';
  } catch (e) {
    out.trace = (e as Error).message.replace(/^line 2: register: /, '');
  }
  try {
    new RatioEngine(host()).register({ pid: 100, starttime: 1, vcpus });
    out.engine = 'ok';
  } catch (e) {
    out.engine = (e as Error).message;
  }
  return out;
}

const same = (message: string) => ({ rule: message, v2: message, cli: message, trace: message, engine: message });

describe('the vCPU-list rule', () => {
  test('every entry point accepts a good list', () => {
    expect(
      answers([
        { tid: 4250, vpkg: 0 },
        { tid: 4251, vpkg: 255 },
        { tid: MAX_TID, vpkg: 1 },
      ]),
    ).toEqual(same('ok'));
  });

  test('every entry point refuses a thread listed twice with the same words, numbering entries from 1', () => {
    expect(
      answers([
        { tid: 5, vpkg: 0 },
        { tid: 5, vpkg: 1 },
      ]),
    ).toEqual(same('vCPU 2: thread 5 is listed twice'));
  });

  test('every entry point refuses a virtual package over 255 with the same words', () => {
    expect(
      answers([
        { tid: 5, vpkg: 0 },
        { tid: 6, vpkg: 256 },
      ]),
    ).toEqual(same('vCPU 2: virtual package 256 is out of range (0..255)'));
  });

  test('the wire, the engine and the rule refuse a thread id over MAX_TID alike', () => {
    const a = answers([{ tid: MAX_TID + 1, vpkg: 0 }]);
    const message = `vCPU 1: thread id ${MAX_TID + 1} is out of range (1..${MAX_TID})`;
    expect([a.rule, a.v2, a.cli, a.engine]).toEqual([message, message, message, message]);
    // The trace reader refuses it earlier, as any id field: a positive integer id up to MAX_TID.
    expect(a.trace).toMatch(`vm.vcpus[0].tid must be a positive integer id, got ${MAX_TID + 1}`);
  });

  test('checkVcpus refuses an empty list and more than 4096 entries, and copies only tid and vpkg', () => {
    expect(checkVcpus([])).toEqual({ ok: false, error: 'the vCPU list is empty: a VM has at least one vCPU' });
    const many = Array.from({ length: 4097 }, (_, i) => ({ tid: i + 1, vpkg: 0 }));
    expect(checkVcpus(many)).toEqual({ ok: false, error: 'the vCPU list has 4097 entries, at most 4096' });
    const extra = [{ tid: 9, vpkg: 0, name: 'x' }] as unknown as VcpuSpec[];
    expect(checkVcpus(extra)).toEqual({ ok: true, value: [{ tid: 9, vpkg: 0 }] });
  });

  test('every entry point refuses an empty list; the engine alone takes one (a VM with no known vCPU thread gets no energy until updateVcpus names some)', () => {
    const a = answers([]);
    const message = 'the vCPU list is empty: a VM has at least one vCPU';
    expect(a.rule).toBe(message);
    expect(a.trace).toBe(message);
    expect(a.cli).toMatch(/^the vCPU list is empty/);
    // REGISTER's payload size follows from nvcpu, so the wire refuses 0 while reading the frame.
    expect(a.v2).toBe('nvcpu must be 1..4096, got 0');
    expect(a.engine).toBe('ok');
    expect(checkVcpus([], { allowEmpty: true })).toEqual({ ok: true, value: [] });
    expect(checkVcpus([{ tid: 0, vpkg: 0 }], { allowEmpty: true })).toEqual({
      ok: false,
      error: `vCPU 1: thread id 0 is out of range (1..${MAX_TID})`,
    });
  });
});
