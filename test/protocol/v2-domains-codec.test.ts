/**
 * The other RAPL domains on the v2 wire (docs/protocol-v2.md, "Other RAPL domains"): UPDATE and
 * HOST_UPDATE round trips with and without the domain block, the request flags, and frames a hostile
 * or broken helper could send (counts, codes, sizes) refused with a message that says why.
 */
import { describe, expect, it } from 'vitest';
import {
  CLIENT_TYPES,
  HELPER_TYPES,
  T,
  domainCode,
  domainOfCode,
  encodeFrame,
  encodeHostUpdate,
  encodeObserve,
  encodeSubscribe,
  encodeUpdate,
  type HostValues,
} from '../../src/protocol/v2/codec.js';
import { FrameDecoder, type Frame } from '../../src/protocol/v2/frame-decoder.js';
import { parseClientFrame, parseHelperFrame } from '../../src/protocol/v2/messages.js';
import { ENERGY_DOMAINS } from '../../src/model/domains.js';

const STATS = {
  legacyOk: 1n,
  legacyRefused: 0n,
  legacyFailed: 0n,
  lastSampleDurationNs: 5n,
  samples: 9n,
  sampleFailures: 0n,
  connections: 2,
  vms: 1,
};

/** Every frame in `bytes`, fed in chunks of `chunk` bytes (the decoder keeps partial frames). */
function frames(bytes: Buffer, types: ReadonlySet<number>, chunk = 1): Frame[] {
  const d = new FrameDecoder(types);
  const out: Frame[] = [];
  for (let i = 0; i < bytes.length; i += chunk)
    for (const f of d.push(bytes.subarray(i, i + chunk))) {
      if (!f.ok) throw new Error(f.error.message);
      out.push(f.value);
    }
  expect(d.incompleteBytes).toBe(0);
  return out;
}

const reply = (b: Buffer) => parseHelperFrame(frames(b, HELPER_TYPES, 64)[0]!);

const VPKGS = [
  { counter: 5n, energyUj: 1_000n },
  { counter: 6n, energyUj: 2_000n },
];

/** An UPDATE with the domain block whose payload is then edited by `edit` (offsets into the payload). */
function editedUpdate(edit: (p: Buffer) => Buffer): Buffer {
  const f = encodeUpdate(3, 77n, VPKGS, false, [
    { domain: 'core', vpkgEnergyUj: [400n, 800n] },
    { domain: 'dram', vpkgEnergyUj: [100n, 200n] },
  ]);
  const p = edit(Buffer.from(f.subarray(8)));
  return encodeFrame(T.UPDATE, f.readUInt16LE(2), p);
}

/** Offset of the UPDATE domain block (after 2 vpkgs). */
const BLOCK = 16 + 16 * 2;

describe('domain codes', () => {
  it('are the index in ENERGY_DOMAINS, and a code of 0 (the package) or past the list names no other domain', () => {
    expect(ENERGY_DOMAINS.slice(1).map((d) => domainCode(d as Exclude<typeof d, 'package'>))).toEqual([1, 2, 3, 4]);
    expect([1, 2, 3, 4].map(domainOfCode)).toEqual(['core', 'uncore', 'dram', 'psys']);
    expect([0, 5, 0xffffffff].map(domainOfCode)).toEqual([null, null, null]);
  });
});

describe('UPDATE with the other domains', () => {
  it('round-trips per-domain per-vpkg energy, read byte by byte, with FLAG_DOMAINS beside ENDED', () => {
    const domains = [
      { domain: 'core' as const, vpkgEnergyUj: [1n, 2n] },
      { domain: 'uncore' as const, vpkgEnergyUj: [3n, 4n] },
      { domain: 'dram' as const, vpkgEnergyUj: [2n ** 63n, 0n] },
      { domain: 'psys' as const, vpkgEnergyUj: [7n, 8n] },
    ];
    const f = encodeUpdate(3, 77n, VPKGS, true, domains);
    expect(f.readUInt16LE(2)).toBe(0x3);
    expect(f.length).toBe(8 + BLOCK + 8 + 4 * (8 + 16));
    const [frame] = frames(f, HELPER_TYPES, 1);
    expect(parseHelperFrame(frame!)).toEqual({
      ok: true,
      value: { type: T.UPDATE, vmId: 3, tNs: 77n, vpkgs: VPKGS, ended: true, domains },
    });
  });

  it('carries an empty block when the client asked and the host reads only the package, and no block when it did not ask', () => {
    const asked = encodeUpdate(3, 77n, VPKGS, false, []);
    expect(asked.length).toBe(8 + BLOCK + 8);
    expect(reply(asked)).toEqual({ ok: true, value: { type: T.UPDATE, vmId: 3, tNs: 77n, vpkgs: VPKGS, ended: false, domains: [] } });
    const plain = encodeUpdate(3, 77n, VPKGS, false);
    expect(plain.readUInt16LE(2)).toBe(0);
    expect(plain.length).toBe(8 + BLOCK);
    const m = reply(plain);
    expect(m.ok && 'domains' in m.value).toBe(false);
  });

  it('refuses to encode a domain whose values do not match the vpkgs', () => {
    expect(() => encodeUpdate(3, 0n, VPKGS, false, [{ domain: 'dram', vpkgEnergyUj: [1n] }])).toThrow(
      /dram domain has 1 values for 2 vpkgs/,
    );
  });

  it('refuses unknown domain codes, the package as a domain, a domain twice and a count past the domains that exist', () => {
    const at = (i: number) => BLOCK + 8 + i * (8 + 16);
    const cases: [string, (p: Buffer) => Buffer, RegExp][] = [
      [
        'unknown code',
        (p) => (p.writeUInt32LE(9, at(1)), p),
        /^UPDATE domain entry 1: domain code 9 is not one this client knows \(1 core, 2 uncore, 3 dram, 4 psys\); update the client/,
      ],
      ['package', (p) => (p.writeUInt32LE(0, at(0)), p), /^UPDATE domain entry 0: domain code 0 is not one/],
      ['twice', (p) => (p.writeUInt32LE(1, at(1)), p), /^UPDATE carries the core domain twice$/],
      ['count 5', (p) => (p.writeUInt32LE(5, BLOCK), p), /^UPDATE carries 5 domains, at most 4 exist besides the package$/],
      ['count 2^32-1', (p) => (p.writeUInt32LE(0xffffffff, BLOCK), p), /^UPDATE carries 4294967295 domains/],
      ['count 1 for 2 entries', (p) => (p.writeUInt32LE(1, BLOCK), p), /^UPDATE payload is 104 bytes, expected 80 \(2 vpkgs, 1 domains\)$/],
      ['cut off', (p) => p.subarray(0, p.length - 8), /^UPDATE payload is 96 bytes, expected 104/],
      ['one byte more', (p) => Buffer.concat([p, Buffer.alloc(1)]), /^UPDATE payload is 105 bytes, expected 104/],
      ['no block', (p) => p.subarray(0, BLOCK + 4), /^UPDATE payload is 52 bytes, expected 56$/],
    ];
    for (const [what, edit, message] of cases) {
      const m = reply(editedUpdate(edit));
      expect(m.ok, what).toBe(false);
      if (!m.ok) expect(m.error, what).toMatch(message);
    }
  });

  it('reads the layout from the frame: a block without the flag is refused, not ignored', () => {
    const f = editedUpdate((p) => p);
    f.writeUInt16LE(0, 2);
    expect(reply(f)).toEqual({ ok: false, error: 'UPDATE payload is 104 bytes, expected 48' });
  });
});

describe('HOST_UPDATE with the other domains', () => {
  const h: HostValues = {
    tNs: 9n,
    packages: [
      { pkg: 0, energyUj: 10_000n, unattributedUj: 3_000n },
      { pkg: 1, energyUj: 20_000n, unattributedUj: 4_000n },
    ],
    unattributedUj: 7_000n,
    vmsChanged: true,
    stats: STATS,
    domains: [
      { pkg: 0, domain: 'core', energyUj: 5_000n, unattributedUj: 1_000n },
      { pkg: 0, domain: 'dram', energyUj: 900n, unattributedUj: 90n },
      { pkg: 0, domain: 'psys', energyUj: 40_000n, unattributedUj: 9_000n },
      { pkg: 1, domain: 'dram', energyUj: 800n, unattributedUj: 80n },
    ],
  };
  const BASE = 80 + 2 * 24;
  const at = (i: number) => BASE + 8 + 24 * i;
  const edited = (edit: (p: Buffer) => Buffer, from: HostValues = h) => {
    const f = encodeHostUpdate(from);
    return encodeFrame(T.HOST_UPDATE, f.readUInt16LE(2), edit(Buffer.from(f.subarray(8))));
  };

  it('round-trips per package and domain energy and unattributed energy, in both package layouts', () => {
    const f = encodeHostUpdate(h);
    expect(f.readUInt16LE(2)).toBe(0x7);
    expect(f.length).toBe(8 + BASE + 8 + 4 * 24);
    expect(reply(f)).toEqual({ ok: true, value: { type: T.HOST_UPDATE, ...h } });
    const plain: HostValues = { ...h, packages: h.packages.map((p) => ({ ...p, unattributedUj: null })), vmsChanged: false };
    const g = encodeHostUpdate(plain);
    expect(g.readUInt16LE(2)).toBe(0x4);
    expect(reply(g)).toEqual({ ok: true, value: { type: T.HOST_UPDATE, ...plain } });
    // Asked for, none on the host: an empty block.
    expect(reply(encodeHostUpdate({ ...h, domains: [] }))).toEqual({ ok: true, value: { type: T.HOST_UPDATE, ...h, domains: [] } });
  });

  it('without domains asked keeps the layout of before, byte for byte', () => {
    const { domains: _d, ...old } = h;
    const f = encodeHostUpdate(old);
    expect(f.readUInt16LE(2) & 0x4).toBe(0);
    expect(f.length).toBe(8 + BASE);
    expect(f.equals(encodeHostUpdate({ ...h, domains: undefined } as HostValues))).toBe(true);
  });

  it('refuses unknown codes, a (package, domain) twice, a package the frame does not list, and counts that do not fit', () => {
    const cases: [string, (p: Buffer) => Buffer, RegExp][] = [
      [
        'unknown code',
        (p) => (p.writeUInt32LE(77, at(2) + 4), p),
        /^HOST_UPDATE domain entry 2: domain code 77 is not one this client knows/,
      ],
      ['package as a domain', (p) => (p.writeUInt32LE(0, at(0) + 4), p), /^HOST_UPDATE domain entry 0: domain code 0 is not one/],
      ['twice', (p) => (p.writeUInt32LE(0, at(3)), p), /^HOST_UPDATE carries the dram domain of package 0 twice$/],
      [
        'unlisted package',
        (p) => (p.writeUInt32LE(7, at(3)), p),
        /^HOST_UPDATE domain entry 3 names package 7, which the frame does not list$/,
      ],
      [
        'huge count',
        (p) => (p.writeUInt32LE(0xffffffff, BASE), p),
        /^HOST_UPDATE payload is 232 bytes, expected \d+ \(4294967295 domain entries for 2 packages\)$/,
      ],
      [
        'count past the domains 2 packages can have',
        (p) => Buffer.concat([(p.writeUInt32LE(9, BASE), p), Buffer.alloc(5 * 24)]),
        /\(9 domain entries for 2 packages\)$/,
      ],
      ['cut off', (p) => p.subarray(0, p.length - 1), /^HOST_UPDATE payload is 231 bytes, expected 232/],
      ['no block', (p) => p.subarray(0, BASE), /^HOST_UPDATE payload is 128 bytes, expected 136$/],
    ];
    for (const [what, edit, message] of cases) {
      const m = reply(edited(edit));
      expect(m.ok, what).toBe(false);
      if (!m.ok) expect(m.error, what).toMatch(message);
    }
  });
});

describe('requests asking for the other domains', () => {
  it('SUBSCRIBE and OBSERVE take flags bit 0 and refuse any other bit without closing', () => {
    const parse = (b: Buffer) => parseClientFrame(frames(b, CLIENT_TYPES)[0]!);
    expect(parse(encodeSubscribe(4, { domains: true }))).toEqual({ ok: true, value: { type: T.SUBSCRIBE, vmId: 4, domains: true } });
    expect(parse(encodeObserve(4, { domains: true }))).toEqual({ ok: true, value: { type: T.OBSERVE, vmId: 4, domains: true } });
    expect(encodeSubscribe(4).equals(encodeSubscribe(4, { domains: false }))).toBe(true);
    expect(encodeSubscribe(4).readUInt16LE(2)).toBe(0);
    for (const type of [T.SUBSCRIBE, T.OBSERVE])
      for (const flags of [0x2, 0x3, 0x8000]) {
        const p = Buffer.alloc(4);
        expect(parse(encodeFrame(type, flags, p))).toEqual({
          ok: false,
          error: { code: 1, fatal: false, message: `flags must be 0 or 0x1 (other RAPL domains), got 0x${flags.toString(16)}` },
        });
      }
  });
});
