/**
 * The statistics file format and the STATS_FD frames against bytes written by hand from
 * docs/stats-fd.md (little-endian, 8-byte aligned blocks), both ways: the encoder must give exactly
 * these bytes, the decoder must read them back; and the decoder refuses what a hostile file could say.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { StatsReader } from '../../src/client/stats-reader.js';
import { CLIENT_TYPES, HELPER_TYPES, encodeU32Frame, encodeStatsFdReply, T } from '../../src/protocol/v2/codec.js';
import { FrameDecoder } from '../../src/protocol/v2/frame-decoder.js';
import { parseClientFrame, parseHelperFrame } from '../../src/protocol/v2/messages.js';
import { STATS_BASE, STATS_TYPE, STATS_UNIT } from '../../src/protocol/stats/flags.js';
import { decodeStatsLayout, encodeStatsFile, planStatsLayout } from '../../src/protocol/stats/layout.js';
import { SampleBlock, readConsistent } from '../../src/protocol/stats/sample-block.js';
import { decodeStatsValues, describeDescriptor } from '../support/stats-values.js';
import { vmStatsLayout, tickExponent, vmStatsSlots, writeVmStats } from '../../src/protocol/stats/vm-file.js';
import { hostDomainShapes, hostStatsLayout, writeHostStats } from '../../src/protocol/stats/host-file.js';

const hex = (text: string): Buffer => Buffer.from(text.replace(/\s+/g, ''), 'hex');
const oneFrame = (bytes: Buffer, types: ReadonlySet<number>) => {
  const out = new FrameDecoder(types).push(bytes);
  expect(out).toHaveLength(1);
  if (!out[0]!.ok) throw new Error(out[0]!.error.message);
  return out[0]!.value;
};

/** 64 bytes: `text` then NULs. */
const name64 = (text: string) => Buffer.concat([Buffer.from(text), Buffer.alloc(64 - text.length)]).toString('hex');

describe('STATS_FD frames', () => {
  it('STATS_FD of VM 7 is type 0x09 with a u32; its reply 0x87 carries the id and the file size', () => {
    const req = hex('0900 0000 04000000 07000000');
    expect(encodeU32Frame(T.STATS_FD, 7).equals(req)).toBe(true);
    expect(parseClientFrame(oneFrame(req, CLIENT_TYPES))).toEqual({ ok: true, value: { type: 0x09, vmId: 7 } });
    const rep = hex('8700 0000 08000000 07000000 40020000');
    expect(encodeStatsFdReply(7, 576).equals(rep)).toBe(true);
    expect(parseHelperFrame(oneFrame(rep, HELPER_TYPES))).toEqual({ ok: true, value: { type: 0x87, vmId: 7, fileSize: 576 } });
  });

  it('STATS_FD with a payload of the wrong size is fatal ERROR 1, with flags set it is ERROR 1 and the connection stays', () => {
    const short = parseClientFrame(oneFrame(hex('0900 0000 02000000 0700'), CLIENT_TYPES));
    expect(short).toMatchObject({ ok: false, error: { code: 1, fatal: true } });
    const flagged = parseClientFrame(oneFrame(hex('0900 0100 04000000 07000000'), CLIENT_TYPES));
    expect(flagged).toMatchObject({ ok: false, error: { code: 1, fatal: false } });
  });
});

describe('the statistics file layout', () => {
  // Two descriptors: generation (instant, no unit) and energy[2] (cumulative, joules 0x8, 10^-6).
  const descs = [
    { name: 'generation', flags: STATS_TYPE.INSTANT | STATS_UNIT.NONE, exponent: 0, size: 1 },
    { name: 'energy', flags: STATS_TYPE.CUMULATIVE | STATS_UNIT.JOULES | STATS_BASE.POW10, exponent: -6, size: 2 },
  ];
  const file = hex(
    // header: flags 0, name_size 64, num_desc 2, id_offset 24, desc_offset 88, data_offset 248
    '00000000 40000000 02000000 18000000 58000000 f8000000' +
      name64('vm-1') +
      // generation: flags 0x01, exponent 0, size 1, offset 0, reserved 0, name
      '01000000 0000 0100 00000000 00000000' +
      name64('generation') +
      // energy: flags 0x80 (cumulative, unit 0x8), exponent -6 (0xfffa), size 2, offset 8
      '80000000 faff 0200 08000000 00000000' +
      name64('energy') +
      // data: generation 0, energy[0] 0, energy[1] 0
      '0000000000000000 0000000000000000 0000000000000000',
  );

  it('encodes header, id string, descriptors and a zeroed data block at the offsets the document gives', () => {
    const layout = planStatsLayout('vm-1', descs);
    expect(layout.fileSize).toBe(272);
    expect(encodeStatsFile(layout).equals(file)).toBe(true);
  });

  it('decodes them back, values by name, and describes a descriptor in words', () => {
    const r = decodeStatsLayout(file, file.length);
    if (!r.ok) throw new Error(r.error);
    expect(r.value.id).toBe('vm-1');
    expect(r.value.descriptors).toEqual([
      { ...descs[0], offset: 0 },
      { ...descs[1], offset: 8 },
    ]);
    const data = Buffer.from(file.subarray(248));
    data.writeBigUInt64LE(12345n, 16);
    expect(decodeStatsValues(r.value, data).get('energy')).toEqual([0n, 12345n]);
    expect(describeDescriptor(r.value.descriptors[1]!)).toBe('energy[2] cumulative J x1e-6');
  });

  it('refuses a file whose offsets, names or sizes do not hold', () => {
    const bad = (patch: (b: Buffer) => void) => {
      const b = Buffer.from(file);
      patch(b);
      const r = decodeStatsLayout(b, b.length);
      expect(r.ok).toBe(false);
      return r.ok ? '' : r.error;
    };
    expect(bad((b) => b.writeUInt32LE(250, 20))).toMatch(/multiple of 8/);
    expect(bad((b) => b.writeUInt32LE(16, 12))).toMatch(/overlaps the header/);
    expect(bad((b) => b.writeUInt32LE(1000, 8))).toMatch(/num_desc/);
    expect(bad((b) => b.writeUInt16LE(9, 88 + 80 + 6))).toMatch(/values end at/);
    expect(bad((b) => b.fill(0x41, 88 + 16, 88 + 80))).toMatch(/NUL-terminated/);
    expect(bad((b) => b.writeUInt32LE(0, 88 + 80 + 8))).toMatch(/overlap/);
    expect(bad((b) => b.writeUInt32LE(0x10000, 88))).toMatch(/unknown bits/);
    expect(decodeStatsLayout(file.subarray(0, 10), 272).ok).toBe(false);
  });

  it('a VM file of 2 virtual packages and 3 vCPUs has one array descriptor per per-vpkg and per-vCPU value', () => {
    const l = vmStatsLayout({ hostVmId: 3, pid: 99, name: 'web', nvpkg: 2, nvcpu: 3, tickExponent: tickExponent(100), domains: [] });
    expect(l.id).toBe('vmsr-vm-3/pid-99/web');
    const size = Object.fromEntries(l.descriptors.map((d) => [d.name, d.size]));
    expect(size).toMatchObject({
      energy: 2,
      msr_energy_status: 2,
      power: 2,
      vcpu_energy: 3,
      vcpu_cpu_time: 3,
      vcpu_tid: 3,
      other_threads_cpu_time: 1,
    });
    expect(l.descriptors.find((d) => d.name === 'vcpu_cpu_time')!.exponent).toBe(-2);
    expect(tickExponent(64)).toBeNull();
    expect(
      vmStatsLayout({ hostVmId: 3, pid: 99, name: null, nvpkg: 1, nvcpu: 1, tickExponent: null, domains: [] }).descriptors.some(
        (d) => d.name === 'vcpu_cpu_time',
      ),
    ).toBe(false);
  });
});

describe('the other RAPL domains in the files', () => {
  it('a VM file has <domain>_energy and <domain>_power per virtual package for each domain read, after every older descriptor, and none without domains', () => {
    const shape = { hostVmId: 3, pid: 99, name: null, nvpkg: 2, nvcpu: 1, tickExponent: -2, domains: ['core', 'dram'] as const };
    const l = vmStatsLayout({ ...shape, domains: [...shape.domains] });
    const without = vmStatsLayout({ ...shape, domains: [] });
    // The descriptors of a file without domains come first, unchanged: a reader by name or by position of old sees the same.
    expect(l.descriptors.slice(0, without.descriptors.length)).toEqual(without.descriptors);
    expect(l.descriptors.slice(without.descriptors.length).map(describeDescriptor)).toEqual([
      'core_energy[2] cumulative J x1e-6',
      'core_power[2] instant W x1e-6',
      'dram_energy[2] cumulative J x1e-6',
      'dram_power[2] instant W x1e-6',
    ]);
    const mem = new ArrayBuffer(l.fileSize);
    const b = new SampleBlock(mem, l);
    const slots = vmStatsSlots(b, { ...shape, domains: [...shape.domains] });
    b.write((w) =>
      writeVmStats(w, slots, {
        monotonicNs: 1n,
        realtimeNs: 2n,
        nextMonotonicNs: 3n,
        intervalNs: 4n,
        ended: false,
        energyUj: [10, 20],
        counter: [1, 2],
        powerUw: [5, 6],
        vcpus: [],
        otherTicks: 0,
        domains: [
          { domain: 'dram', energyUj: [7, 8], powerUw: [1.9, 2] },
          { domain: 'uncore', energyUj: [99, 99], powerUw: [9, 9] }, // not in this file: left out
        ],
      }),
    );
    const v = decodeStatsValues(l, Buffer.from(mem, l.dataOffset, l.dataSize));
    expect(v.get('dram_energy')).toEqual([7n, 8n]);
    expect(v.get('dram_power')).toEqual([1n, 2n]);
    expect(v.get('core_energy')).toEqual([0n, 0n]);
    expect(v.has('uncore_energy')).toBe(false);
  });

  it('the host file has, per domain read, the packages it is read on with their energy and unattributed energy (psys once)', () => {
    const pairs = [
      { pkg: 0, domain: 'dram' as const },
      { pkg: 0, domain: 'psys' as const },
      { pkg: 1, domain: 'dram' as const },
    ];
    const shapes = hostDomainShapes(pairs);
    expect(shapes).toEqual([
      { domain: 'dram', packages: [0, 1] },
      { domain: 'psys', packages: [0] },
    ]);
    const l = hostStatsLayout(42, 2, { domains: shapes });
    const old = hostStatsLayout(42, 2);
    expect(l.descriptors.slice(0, old.descriptors.length)).toEqual(old.descriptors);
    expect(l.descriptors.slice(old.descriptors.length).map((d) => `${d.name}[${d.size}]`)).toEqual([
      'dram_package_id[2]',
      'dram_energy[2]',
      'dram_unattributed_energy[2]',
      'psys_package_id[1]',
      'psys_energy[1]',
      'psys_unattributed_energy[1]',
    ]);
    const mem = new ArrayBuffer(l.fileSize);
    const b = new SampleBlock(mem, l);
    const zero = { legacyOk: 0n, legacyRefused: 0n, legacyFailed: 0n, samples: 0n, sampleFailures: 0n, vmChanges: 0n };
    b.write((w) =>
      writeHostStats(
        w,
        {
          monotonicNs: 1n,
          realtimeNs: 1n,
          nextMonotonicNs: 1n,
          intervalNs: 1n,
          packages: [
            { pkg: 0, energyUj: 100n, unattributedUj: 50n },
            { pkg: 1, energyUj: 200n, unattributedUj: 60n },
          ],
          unattributedUj: 110n,
          lastSampleDurationNs: 0n,
          ...zero,
          connections: 0,
          vms: 0,
          energySource: 1,
          domains: [
            { pkg: 1, domain: 'dram', energyUj: 21n, unattributedUj: 11n },
            { pkg: 0, domain: 'dram', energyUj: 20n, unattributedUj: 10n },
            { pkg: 0, domain: 'psys', energyUj: 300n, unattributedUj: 3n },
            { pkg: 1, domain: 'psys', energyUj: 1n, unattributedUj: 1n }, // no place for it: left out
          ],
        },
        shapes,
      ),
    );
    const v = decodeStatsValues(l, Buffer.from(mem, l.dataOffset, l.dataSize));
    expect(v.get('dram_package_id')).toEqual([0n, 1n]);
    expect(v.get('dram_energy')).toEqual([20n, 21n]);
    expect(v.get('dram_unattributed_energy')).toEqual([10n, 11n]);
    expect(v.get('psys_package_id')).toEqual([0n]);
    expect(v.get('psys_energy')).toEqual([300n]);
    expect(v.get('psys_unattributed_energy')).toEqual([3n]);
  });
});

describe('the generation', () => {
  it('is odd while a sample is written and the next even number after; a reader seeing it change reads again', () => {
    const layout = planStatsLayout('x', [
      { name: 'generation', flags: 0x1, exponent: 0, size: 1 },
      { name: 'a', flags: 0x1, exponent: 0, size: 2 },
    ]);
    const mem = new ArrayBuffer(layout.fileSize);
    const b = new SampleBlock(mem, layout);
    const words = new BigUint64Array(mem, layout.dataOffset, 3);
    let during = -1n;
    b.write((w) => {
      during = words[0]!;
      w.setNumber(w.slot('a'), 2 ** 40 + 5);
      w.setBig(w.slot('a') + 1, 7n);
    });
    expect(during).toBe(1n);
    expect([...words]).toEqual([2n, 2n ** 40n + 5n, 7n]);
    // A reader whose generations differ around its read tries again; a writer that never stops starves it.
    let g = 2n;
    const r = readConsistent(
      () => g,
      () => (g += 2n),
      { tries: 3 },
    );
    expect(r).toBeNull();
    let calls = 0;
    const ok = readConsistent(
      () => 4n,
      () => ++calls,
    );
    expect(ok).toEqual({ generation: 4n, values: 1 });
    // A generation known from before (the last read's closing one) stands for the first read: two calls, not three.
    const gens = [6n];
    const known = readConsistent(
      () => gens.shift()!,
      () => 'v',
      { tries: 3, known: 6n },
    );
    expect(known).toEqual({ generation: 6n, values: 'v' });
    expect(gens).toEqual([]);
    // A known generation that is stale (the writer wrote since) costs one more round, never a torn read.
    const later = [8n, 8n];
    const pauses: number[] = [];
    expect(
      readConsistent(
        () => later.shift()!,
        () => 'w',
        { tries: 3, known: 6n, pause: (i) => pauses.push(i) },
      ),
    ).toEqual({ generation: 8n, values: 'w' });
    // The retry is preceded by a pause (a reader backs off instead of spinning on a preempted writer).
    expect(pauses).toEqual([1]);
  });
});

describe('the scale of a value', () => {
  it('is its base to the power of its exponent, 2 or 10 as its flags say, whatever the exponent', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-stats-scale-'));
    try {
      for (const exponent of [-20, -6, -1, 0, 3]) {
        const layout = planStatsLayout('x', [
          { name: 'generation', flags: 0x1, exponent: 0, size: 1 },
          { name: 'two', flags: STATS_TYPE.CUMULATIVE | STATS_UNIT.JOULES | STATS_BASE.POW2, exponent, size: 1 },
          { name: 'ten', flags: STATS_TYPE.CUMULATIVE | STATS_UNIT.JOULES | STATS_BASE.POW10, exponent, size: 1 },
        ]);
        const file = path.join(dir, `e${exponent}`);
        fs.writeFileSync(file, encodeStatsFile(layout));
        const r = StatsReader.open(fs.openSync(file, 'r'));
        try {
          expect([r.scale('two'), r.scale('ten'), r.scale('absent')]).toEqual([2 ** exponent, 10 ** exponent, 1]);
        } finally {
          r.close();
        }
      }
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
