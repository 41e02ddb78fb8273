import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import {
  CLIENT_TYPES,
  E,
  HELPER_TYPES,
  MAX_PAYLOAD,
  T,
  encodeError,
  encodeFrame,
  encodeU32Frame,
  encodeRead,
  encodeRegister,
  encodeRegistered,
  encodeSubscribe,
  encodeUpdate,
  encodeValue,
} from '../../src/protocol/v2/codec.js';
import { FrameDecoder, type DecodeResult, type Frame } from '../../src/protocol/v2/frame-decoder.js';
import { parseClientFrame, parseHelperFrame } from '../../src/protocol/v2/messages.js';

function frames(rs: DecodeResult[]): Frame[] {
  return rs.map((r) => {
    if (!r.ok) throw new Error(r.error.message);
    return r.value;
  });
}

const clientStream = Buffer.concat([
  encodeRegister({
    pid: 1234,
    vcpus: [
      { tid: 1235, vpkg: 0 },
      { tid: 1236, vpkg: 1 },
    ],
  }),
  encodeRead(7, 1),
  encodeSubscribe(7),
  encodeU32Frame(T.UNREGISTER, 7),
]);

describe('FrameDecoder', () => {
  it('bytesToFrameEnd asks for the rest of the header, then the rest of the payload: reads of that size end at frame ends', () => {
    const d = new FrameDecoder(CLIENT_TYPES);
    const sizes: number[] = [];
    let off = 0;
    let completed = 0;
    while (off < clientStream.length) {
      // One byte less than asked when possible, so partial headers and payloads are both seen.
      const want = d.bytesToFrameEnd;
      sizes.push(want);
      const n = want > 1 && sizes.length % 2 === 0 ? want - 1 : want;
      const got = d.push(clientStream.subarray(off, off + n));
      // Never past a frame's end: at most one frame per read, and none left half-read after it.
      expect(got.length).toBeLessThanOrEqual(1);
      if (got.length === 1) expect(d.incompleteBytes).toBe(0);
      completed += got.length;
      off += n;
      if (off < clientStream.length && d.incompleteBytes === 0) expect(d.bytesToFrameEnd).toBe(8);
    }
    expect(completed).toBe(4);
    expect(d.incompleteBytes).toBe(0);
    expect(sizes[0]).toBe(8);
  });

  it('decodes pipelined frames in one chunk', () => {
    const got = frames(new FrameDecoder(CLIENT_TYPES).push(clientStream));
    expect(got.map((f) => f.type)).toEqual([T.REGISTER, T.READ, T.SUBSCRIBE, T.UNREGISTER]);
    expect(got[0]!.payload.length).toBe(8 + 16);
  });

  it('gives the same frames for the stream split at every byte boundary (two pieces)', () => {
    const whole = frames(new FrameDecoder(CLIENT_TYPES).push(clientStream));
    for (let cut = 0; cut <= clientStream.length; cut++) {
      const d = new FrameDecoder(CLIENT_TYPES);
      const got = frames([...d.push(clientStream.subarray(0, cut)), ...d.push(clientStream.subarray(cut))]);
      expect(got).toEqual(whole);
      expect(d.incompleteBytes).toBe(0);
    }
  });

  it('gives the same frames fed one byte at a time', () => {
    const whole = frames(new FrameDecoder(CLIENT_TYPES).push(clientStream));
    const d = new FrameDecoder(CLIENT_TYPES);
    const got: DecodeResult[] = [];
    for (let i = 0; i < clientStream.length; i++) got.push(...d.push(clientStream.subarray(i, i + 1)));
    expect(frames(got)).toEqual(whole);
  });

  it('matches on any random chunking (property)', () => {
    const whole = frames(new FrameDecoder(CLIENT_TYPES).push(clientStream));
    fc.assert(
      fc.property(fc.array(fc.integer({ min: 0, max: clientStream.length }), { maxLength: 12 }), (cuts) => {
        const points = [0, ...cuts.sort((a, b) => a - b), clientStream.length];
        const d = new FrameDecoder(CLIENT_TYPES);
        const got: DecodeResult[] = [];
        for (let i = 1; i < points.length; i++) got.push(...d.push(clientStream.subarray(points[i - 1], points[i])));
        expect(frames(got)).toEqual(whole);
      }),
    );
  });

  it('refuses an unknown type as soon as the header is in, and stays dead', () => {
    const d = new FrameDecoder(CLIENT_TYPES);
    const bad = encodeFrame(0x81, 0, Buffer.alloc(16)); // a helper->client type sent by a client
    expect(d.push(bad.subarray(0, 7))).toEqual([]);
    const r = d.push(bad.subarray(7, 8));
    expect(r).toHaveLength(1);
    expect(r[0]).toEqual({ ok: false, error: { message: 'unknown frame type REGISTERED', type: 0x81 } });
    expect(d.push(encodeRead(1, 0))).toEqual([]);
  });

  it('refuses a length over 65536 without waiting for (or buffering) the payload', () => {
    const head = Buffer.alloc(8);
    head.writeUInt16LE(T.READ, 0);
    head.writeUInt32LE(MAX_PAYLOAD + 1, 4);
    const d = new FrameDecoder(CLIENT_TYPES);
    const r = d.push(head);
    expect(r[0]!.ok).toBe(false);
    expect(d.incompleteBytes).toBe(0);
  });

  it('accepts exactly 65536 and keeps at most one frame buffered', () => {
    const d = new FrameDecoder(CLIENT_TYPES);
    const f = encodeFrame(T.REGISTER, 0, Buffer.alloc(MAX_PAYLOAD));
    expect(d.push(f.subarray(0, MAX_PAYLOAD))).toEqual([]);
    expect(d.incompleteBytes).toBe(MAX_PAYLOAD);
    const r = frames(d.push(f.subarray(MAX_PAYLOAD)));
    expect(r[0]!.payload.length).toBe(MAX_PAYLOAD);
    expect(() => encodeFrame(T.REGISTER, 0, Buffer.alloc(MAX_PAYLOAD + 1))).toThrow(RangeError);
  });

  it('decodes zero-length frames back to back', () => {
    const z = encodeFrame(T.READ, 0, Buffer.alloc(0));
    const r = frames(new FrameDecoder(CLIENT_TYPES).push(Buffer.concat([z, z, z])));
    expect(r).toHaveLength(3);
  });
});

describe('client payloads (helper side)', () => {
  const parse = (b: Buffer) => parseClientFrame(frames(new FrameDecoder(CLIENT_TYPES).push(b))[0]!);

  it('parses every request', () => {
    expect(parse(encodeRegister({ pid: 0, vcpus: [{ tid: 5, vpkg: 255 }] }))).toEqual({
      ok: true,
      value: { type: T.REGISTER, pid: 0, vcpus: [{ tid: 5, vpkg: 255 }] },
    });
    expect(parse(encodeRead(3, 2))).toEqual({ ok: true, value: { type: T.READ, vmId: 3, vpkg: 2 } });
    expect(parse(encodeSubscribe(9))).toEqual({ ok: true, value: { type: T.SUBSCRIBE, vmId: 9, domains: false } });
    expect(parse(encodeU32Frame(T.UNREGISTER, 9))).toEqual({ ok: true, value: { type: T.UNREGISTER, vmId: 9 } });
  });

  it('wrong sizes are fatal', () => {
    for (const [type, len] of [
      [T.READ, 7],
      [T.READ, 9],
      [T.SUBSCRIBE, 0],
      [T.UNREGISTER, 8],
      [T.REGISTER, 4],
    ] as const) {
      const r = parse(encodeFrame(type, 0, Buffer.alloc(len)));
      expect(r).toMatchObject({ ok: false, error: { fatal: true, code: E.MALFORMED } });
    }
  });

  it('a REGISTER whose nvcpu lies about the length is fatal', () => {
    const f = encodeRegister({
      pid: 1,
      vcpus: [
        { tid: 2, vpkg: 0 },
        { tid: 3, vpkg: 0 },
      ],
    });
    f.writeUInt32LE(3, 8 + 4); // nvcpu 3, two entries
    const r = parse(f);
    expect(r).toMatchObject({ ok: false, error: { fatal: true } });
    const big = encodeRegister({ pid: 1, vcpus: [{ tid: 2, vpkg: 0 }] });
    big.writeUInt32LE(0xffffffff, 12);
    expect(parse(big)).toMatchObject({ ok: false, error: { fatal: true } });
  });

  it('well-framed bad content is refused without closing', () => {
    const cases: Buffer[] = [
      encodeRegister({ pid: 1, vcpus: [] }), // nvcpu 0
      encodeRegister({ pid: 1, vcpus: [{ tid: 2, vpkg: 256 }] }),
      encodeRegister({
        pid: 1,
        vcpus: [
          { tid: 2, vpkg: 0 },
          { tid: 2, vpkg: 1 },
        ],
      }),
      encodeRegister({ pid: 1, vcpus: [{ tid: 0, vpkg: 0 }] }),
      encodeRegister({ pid: 0x80000000, vcpus: [{ tid: 2, vpkg: 0 }] }),
      encodeRegister({ pid: 1, vcpus: Array.from({ length: 4097 }, (_, i) => ({ tid: i + 1, vpkg: 0 })) }),
      encodeFrame(T.READ, 1, Buffer.alloc(8)), // flags must be 0
    ];
    for (const c of cases) {
      const r = parse(c);
      expect(r).toMatchObject({ ok: false, error: { fatal: false, code: E.MALFORMED } });
    }
    // 4096 is the most allowed.
    const ok = parse(encodeRegister({ pid: 1, vcpus: Array.from({ length: 4096 }, (_, i) => ({ tid: i + 1, vpkg: i % 256 })) }));
    expect(ok.ok).toBe(true);
  });
});

describe('helper payloads (client side)', () => {
  const parse = (b: Buffer) => {
    const r = parseHelperFrame(frames(new FrameDecoder(HELPER_TYPES).push(b))[0]!);
    return r.ok ? r.value : new Error(r.error);
  };

  it('round-trips every helper frame, with the ended flag only where set', () => {
    expect(parse(encodeRegistered(4, 2, 0xa0e03n))).toEqual({ type: T.REGISTERED, vmId: 4, nvpkg: 2, powerUnit: 0xa0e03n });
    expect(parse(encodeValue(4, 1, { counter: 0xffffffffn, energyUj: 123456789012345n }, 99n, true))).toEqual({
      type: T.VALUE,
      vmId: 4,
      vpkg: 1,
      counter: 0xffffffffn,
      energyUj: 123456789012345n,
      tNs: 99n,
      ended: true,
    });
    const u = parse(
      encodeUpdate(
        4,
        5n,
        [
          { counter: 1n, energyUj: 2n },
          { counter: 3n, energyUj: 4n },
        ],
        false,
      ),
    );
    expect(u).toEqual({
      type: T.UPDATE,
      vmId: 4,
      tNs: 5n,
      vpkgs: [
        { counter: 1n, energyUj: 2n },
        { counter: 3n, energyUj: 4n },
      ],
      ended: false,
    });
    expect(parse(encodeU32Frame(T.OK, 4))).toEqual({ type: T.OK, vmId: 4 });
    expect(parse(encodeError(E.NOT_PERMITTED, T.REGISTER, 'nope é'))).toEqual({
      type: T.ERROR,
      code: 2,
      requestType: 1,
      message: 'nope é',
    });
    expect(encodeValue(1, 0, { counter: 0n, energyUj: 0n }, 0n, false).readUInt16LE(2)).toBe(0);
    expect(encodeUpdate(1, 0n, [], true).readUInt16LE(2)).toBe(1);
  });

  it('cuts an over-long ERROR message to fit one frame, on a character boundary', () => {
    const f = encodeError(1, 1, 'é'.repeat(40000));
    expect(f.length).toBeLessThanOrEqual(8 + MAX_PAYLOAD);
    const m = parse(f);
    expect(m).not.toBeInstanceOf(Error);
    expect((m as { message: string }).message).toMatch(/^é+$/);
  });

  it('rejects an UPDATE whose n lies', () => {
    const f = encodeUpdate(1, 0n, [{ counter: 1n, energyUj: 1n }], false);
    f.writeUInt32LE(2, 8 + 4);
    expect(parse(f)).toBeInstanceOf(Error);
  });
});
