import { describe, expect, it } from 'vitest';
import {
  CLIENT_TYPES,
  HELPER_TYPES,
  MAX_NAME_BYTES,
  MAX_PAYLOAD,
  T,
  encodeFrame,
  encodeHostSubscribe,
  encodeHostUpdate,
  encodeU32Frame,
  encodeObserve,
  encodeVmList,
  utf8Cut,
  VM_ENTRY_FIXED,
  type HostValues,
  type VmEntry,
} from '../../src/protocol/v2/codec.js';
import { FrameDecoder, type Frame } from '../../src/protocol/v2/frame-decoder.js';
import { parseClientFrame, parseHelperFrame, type HelperMessage } from '../../src/protocol/v2/messages.js';
import { formatUuid } from '../../src/common/uuid.js';
import { hostStats } from '../support/helper-messages.js';

function one(bytes: Buffer, types: ReadonlySet<number>): Frame {
  const got = new FrameDecoder(types).push(bytes);
  expect(got).toHaveLength(1);
  const f = got[0]!;
  if (!f.ok) throw new Error(f.error.message);
  return f.value;
}

/** The helper message of one frame, or a test failure naming why it was refused. */
function reply(bytes: Buffer): HelperMessage {
  const m = parseHelperFrame(one(bytes, HELPER_TYPES));
  if (!m.ok) throw new Error(m.error);
  return m.value;
}

const vm = (id: number, name: string | null, extra: Partial<VmEntry> = {}): VmEntry => ({
  hostVmId: id,
  pid: 1000 + id,
  uid: 64055,
  nvpkg: 2,
  starttime: 123456789n,
  ended: false,
  discovered: true,
  wholeVmOnly: false,
  notWhole: false,
  guestExact: false,
  name,
  uuid: null,
  ...extra,
});

describe('observer requests', () => {
  it('LIST, OBSERVE, UNOBSERVE and HOST_SUBSCRIBE round-trip through the client-side decoder', () => {
    const stream = Buffer.concat([encodeU32Frame(T.LIST, 7), encodeObserve(9), encodeU32Frame(T.UNOBSERVE, 9), encodeHostSubscribe()]);
    const reqs = new FrameDecoder(CLIENT_TYPES).push(stream).map((f) => {
      if (!f.ok) throw new Error(f.error.message);
      return parseClientFrame(f.value);
    });
    expect(reqs).toEqual([
      { ok: true, value: { type: T.LIST, fromId: 7 } },
      { ok: true, value: { type: T.OBSERVE, vmId: 9, domains: false } },
      { ok: true, value: { type: T.UNOBSERVE, vmId: 9 } },
      { ok: true, value: { type: T.HOST_SUBSCRIBE, perPackage: false, domains: false } },
    ]);
  });

  it('a wrong payload size is fatal and non-zero flags are not, for every new request', () => {
    for (const type of [T.LIST, T.OBSERVE, T.UNOBSERVE, T.HOST_SUBSCRIBE]) {
      const size = type === T.HOST_SUBSCRIBE ? 0 : 4;
      const wrong = parseClientFrame(one(encodeFrame(type, 0, Buffer.alloc(size + 1)), CLIENT_TYPES));
      expect(wrong).toMatchObject({ ok: false, error: { fatal: true } });
      const flagged = parseClientFrame(one(encodeFrame(type, 4, Buffer.alloc(size)), CLIENT_TYPES));
      expect(flagged).toMatchObject({ ok: false, error: { fatal: false } });
    }
  });

  it('HOST_SUBSCRIBE takes flags bits 0 (per-package unattributed energy) and 1 (other domains) and refuses every other bit without closing', () => {
    expect(parseClientFrame(one(encodeHostSubscribe({ perPackage: true }), CLIENT_TYPES))).toEqual({
      ok: true,
      value: { type: T.HOST_SUBSCRIBE, perPackage: true, domains: false },
    });
    expect(parseClientFrame(one(encodeHostSubscribe({ perPackage: false, domains: true }), CLIENT_TYPES))).toEqual({
      ok: true,
      value: { type: T.HOST_SUBSCRIBE, perPackage: false, domains: true },
    });
    expect(parseClientFrame(one(encodeHostSubscribe({ perPackage: true, domains: true }), CLIENT_TYPES))).toEqual({
      ok: true,
      value: { type: T.HOST_SUBSCRIBE, perPackage: true, domains: true },
    });
    for (const flags of [0x4, 0x7, 0x8000]) {
      expect(parseClientFrame(one(encodeFrame(T.HOST_SUBSCRIBE, flags, Buffer.alloc(0)), CLIENT_TYPES))).toEqual({
        ok: false,
        error: {
          code: 1,
          fatal: false,
          message: `flags must be 0 or a mix of 0x1 (per-package unattributed energy) and 0x2 (other RAPL domains), got 0x${flags.toString(16)}`,
        },
      });
    }
    // The other requests still take no flag at all.
    expect(parseClientFrame(one(encodeFrame(T.LIST, 1, Buffer.alloc(4)), CLIENT_TYPES))).toMatchObject({
      ok: false,
      error: { fatal: false },
    });
  });

  it('the original request and reply types keep their numbers', () => {
    expect([T.REGISTER, T.READ, T.SUBSCRIBE, T.UNREGISTER, T.REGISTERED, T.VALUE, T.UPDATE, T.OK, T.ERROR]).toEqual([
      1, 2, 3, 4, 0x81, 0x82, 0x83, 0x84, 0xff,
    ]);
  });
});

describe('VM_LIST', () => {
  it('round-trips names, UUIDs and flags', () => {
    const uuid = Buffer.from('0123456789abcdef0123456789abcdef', 'hex');
    const entries = [
      vm(1, 'web-1'),
      vm(2, null, { uuid, discovered: false, ended: true }),
      vm(3, 'ünïcode ☃', { wholeVmOnly: true }),
      vm(4, 'big', { notWhole: true }),
      vm(5, 'exact', { guestExact: true }),
    ];
    const m = reply(encodeVmList(entries));
    if (m.type !== T.VM_LIST) throw new Error('not a VM_LIST');
    expect(m.nextId).toBe(0);
    expect(m.entries).toEqual(entries);
    expect(formatUuid(m.entries[1]!.uuid!)).toBe('01234567-89ab-cdef-0123-456789abcdef');
  });

  it("NOT_WHOLE is bit 4 of an entry's flags, alone when nothing else is set", () => {
    const p = encodeVmList([vm(1, null, { discovered: false, notWhole: true })]);
    // One nameless entry: the last VM_ENTRY_FIXED bytes of the frame.
    expect(p.readUInt16LE(p.length - VM_ENTRY_FIXED + 24)).toBe(0x10);
  });

  it("GUEST_EXACT is bit 5 of an entry's flags, alone when nothing else is set", () => {
    const p = encodeVmList([vm(1, null, { discovered: false, guestExact: true })]);
    expect(p.readUInt16LE(p.length - VM_ENTRY_FIXED + 24)).toBe(0x20);
  });

  it('cuts a long name at a character boundary within 255 bytes', () => {
    const long = '☃'.repeat(200); // 600 bytes of UTF-8
    expect(utf8Cut(long, MAX_NAME_BYTES).length).toBe(255);
    const m = reply(encodeVmList([vm(1, long)]));
    if (m.type !== T.VM_LIST) throw new Error('not a VM_LIST');
    expect(m.entries[0]!.name).toBe('☃'.repeat(85));
  });

  it('pages when the entries do not fit in one frame, next_id naming the first left out', () => {
    const name = 'x'.repeat(255);
    const entries = Array.from({ length: 400 }, (_, i) => vm(i + 1, name));
    const frame = encodeVmList(entries);
    expect(frame.length).toBeLessThanOrEqual(8 + MAX_PAYLOAD);
    const m = reply(frame);
    if (m.type !== T.VM_LIST) throw new Error('not a VM_LIST');
    const fit = Math.floor((MAX_PAYLOAD - 8) / (44 + 255));
    expect(m.entries).toHaveLength(fit);
    expect(m.nextId).toBe(fit + 1);
  });

  it('refuses a count that claims more entries than the payload holds, and trailing bytes', () => {
    const good = encodeVmList([vm(1, 'a')]);
    const lying = Buffer.from(good);
    lying.writeUInt32LE(2, 8);
    expect(parseHelperFrame(one(lying, HELPER_TYPES))).toEqual({ ok: false, error: 'VM_LIST entry 1 is cut off at byte 53' }); // 8-byte header, one 44-byte entry, a 1-byte name
    const longName = Buffer.from(good);
    longName.writeUInt8(200, 8 + 8 + 26);
    expect(parseHelperFrame(one(longName, HELPER_TYPES))).toMatchObject({
      ok: false,
      error: expect.stringMatching(/^VM_LIST entry 0: its name is cut off/),
    });
    const trailing = encodeFrame(T.VM_LIST, 0, Buffer.concat([good.subarray(8), Buffer.alloc(3)]));
    expect(parseHelperFrame(one(trailing, HELPER_TYPES))).toEqual({ ok: false, error: 'VM_LIST payload has 3 bytes after its 1 entries' });
  });
});

const NO_STATS = hostStats();

describe('HOST_UPDATE', () => {
  it('round-trips packages, unattributed energy, stats and the VMs-changed flag', () => {
    const h: HostValues = {
      tNs: 5_000_000_000n,
      packages: [
        { pkg: 0, energyUj: 123_456_789n, unattributedUj: null },
        { pkg: 1, energyUj: 42n, unattributedUj: null },
      ],
      unattributedUj: 99n,
      vmsChanged: true,
      stats: {
        legacyOk: 1n,
        legacyRefused: 2n,
        legacyFailed: 3n,
        lastSampleDurationNs: 4_000n,
        samples: 5n,
        sampleFailures: 6n,
        connections: 7,
        vms: 8,
      },
    };
    const m = reply(encodeHostUpdate(h));
    if (m.type !== T.HOST_UPDATE) throw new Error('not a HOST_UPDATE');
    const { type: _t, ...got } = m;
    expect(got).toEqual(h);
    expect(encodeHostUpdate(h).length).toBe(8 + 80 + 2 * 16);
  });

  it('round-trips per-package unattributed energy in 24-byte entries with flags bit 1, beside VMs-changed', () => {
    const h: HostValues = {
      tNs: 7n,
      packages: [
        { pkg: 0, energyUj: 1_000n, unattributedUj: 250n },
        { pkg: 3, energyUj: 2n ** 63n, unattributedUj: 2n ** 62n },
      ],
      unattributedUj: 2n ** 62n + 250n,
      vmsChanged: false,
      stats: NO_STATS,
    };
    const f = encodeHostUpdate(h);
    expect(f.length).toBe(8 + 80 + 2 * 24);
    expect(f.readUInt16LE(2)).toBe(0x2);
    const m = reply(f);
    if (m.type !== T.HOST_UPDATE) throw new Error('not a HOST_UPDATE');
    const { type: _t, ...got } = m;
    expect(got).toEqual(h);
    expect(reply(encodeHostUpdate({ ...h, vmsChanged: true }))).toMatchObject({ vmsChanged: true, packages: h.packages });
  });

  it('refuses to encode packages of which only some carry their unattributed energy', () => {
    const mixed = {
      tNs: 0n,
      packages: [
        { pkg: 0, energyUj: 1n, unattributedUj: 1n },
        { pkg: 1, energyUj: 1n, unattributedUj: null },
      ],
      unattributedUj: 1n,
      vmsChanged: false,
      stats: NO_STATS,
    };
    expect(() => encodeHostUpdate(mixed)).toThrow(/either every package carries its unattributed energy or none does/);
  });

  it('refuses a package count that does not match the size', () => {
    const f = encodeHostUpdate({
      tNs: 0n,
      packages: [{ pkg: 0, energyUj: 0n, unattributedUj: null }],
      unattributedUj: 0n,
      vmsChanged: false,
      stats: NO_STATS,
    });
    f.writeUInt32LE(2, 8 + 72);
    expect(parseHelperFrame(one(f, HELPER_TYPES))).toMatchObject({
      ok: false,
      error: expect.stringMatching(/^HOST_UPDATE payload is \d+ bytes, expected \d+$/),
    });
  });

  it('reads the entry size from the flag: entries of the other layout are refused, not misread', () => {
    // Three 16-byte entries are 48 bytes, two 24-byte entries too: the count must match the flag's layout.
    const original = encodeHostUpdate({
      tNs: 0n,
      packages: [0, 1, 2].map((pkg) => ({ pkg, energyUj: 5n, unattributedUj: null })),
      unattributedUj: 0n,
      vmsChanged: false,
      stats: NO_STATS,
    });
    const flagged = Buffer.from(original);
    flagged.writeUInt16LE(0x2, 2);
    expect(parseHelperFrame(one(flagged, HELPER_TYPES))).toEqual({ ok: false, error: 'HOST_UPDATE payload is 128 bytes, expected 152' });
    const unflagged = encodeHostUpdate({
      tNs: 0n,
      packages: [{ pkg: 0, energyUj: 5n, unattributedUj: 1n }],
      unattributedUj: 1n,
      vmsChanged: false,
      stats: NO_STATS,
    });
    unflagged.writeUInt16LE(0, 2);
    expect(parseHelperFrame(one(unflagged, HELPER_TYPES))).toEqual({ ok: false, error: 'HOST_UPDATE payload is 104 bytes, expected 96' });
  });
});
