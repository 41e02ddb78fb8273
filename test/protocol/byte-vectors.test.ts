/**
 * The wire formats against bytes written by hand from the protocol tables (docs/protocol-v2.md,
 * docs/daemon.md; all integers little-endian), never produced by our encoder: a byte offset that the
 * encoder and the parser got wrong the same way would pass a round trip, not these. Each vector is
 * checked both ways: our encoder must produce exactly these bytes, our decoder must read them back
 * to exactly these fields.
 */
import { describe, expect, it } from 'vitest';
import {
  CLIENT_TYPES,
  HELPER_TYPES,
  encodeError,
  encodeHostSubscribe,
  encodeHostUpdate,
  encodeLimit,
  encodeLimitState,
  encodeU32Frame,
  encodeObserve,
  encodeRead,
  encodeRegister,
  encodeRegistered,
  encodeSubscribe,
  encodeUpdate,
  encodeValue,
  encodeVmList,
  T,
} from '../../src/protocol/v2/codec.js';
import { FrameDecoder } from '../../src/protocol/v2/frame-decoder.js';
import { parseClientFrame, parseHelperFrame } from '../../src/protocol/v2/messages.js';
import { classifyPreamble, encodeLegacyRequest, LegacyFramer, V2_MAGIC } from '../../src/protocol/legacy.js';
import { pino } from 'pino';
import { MsrDevice } from '../../src/msr/device.js';
import { FakeHost, legacyOnFakeHost } from '../support/fake-host.js';

/** "0100 0000 ..." -> bytes; spaces are only for the reader. */
const hex = (text: string): Buffer => Buffer.from(text.replace(/\s+/g, ''), 'hex');

/** Decodes exactly one frame from bytes fed one at a time (so no vector passes by luck of chunking). */
function oneFrame(bytes: Buffer, types: ReadonlySet<number>) {
  const d = new FrameDecoder(types);
  const out = [];
  for (const b of bytes) out.push(...d.push(Buffer.from([b])));
  expect(out).toHaveLength(1);
  const f = out[0]!;
  if (!f.ok) throw new Error(f.error.message);
  expect(d.incompleteBytes).toBe(0);
  return f.value;
}

//            type  flags length    payload
const REGISTER = hex('0100 0000 18000000  92100000 02000000  9a100000 00000000  9b100000 01000000');
const READ = hex('0200 0000 08000000  07000000 01000000');
const SUBSCRIBE = hex('0300 0000 04000000  07000000');
const UNREGISTER = hex('0400 0000 04000000  04030201');
const REGISTERED = hex('8100 0000 10000000  07000000 02000000 030e0a0000000000');
const VALUE_ENDED = hex('8200 0100 20000000  07000000 01000000 7856341200000000 40420f0000000000 0807060504030201');
const UPDATE = hex(
  '8300 0000 30000000  07000000 02000000 00f2052a01000000  0100000000000000 3d00000000000000  ffffffff00000000 0000000001000000',
);
const OK = hex('8400 0000 04000000  07000000');
const ERROR = hex('ff00 0000 0d000000  04000000 01000000 6c696d6974');

// Observer frames (docs/protocol-v2.md, "Observers").
const LIST = hex('0500 0000 04000000  07000000');
const OBSERVE = hex('0600 0000 04000000  09000000');
const UNOBSERVE = hex('0700 0000 04000000  04030201');
const HOST_SUBSCRIBE = hex('0800 0000 00000000');
// HOST_SUBSCRIBE with flags bit 0: per-package unattributed energy wanted.
const HOST_SUBSCRIBE_PER_PACKAGE = hex('0800 0100 00000000');
// VM_LIST: u32 count, u32 next_id, then per entry u32 host_vm_id, u32 pid, u32 uid, u32 nvpkg,
// u64 starttime, u16 flags, u8 name_len, u8 reserved, 16-byte uuid, name. 8 + (44 + 5) + 44 = 101.
const VM_LIST = hex(`8500 0000 65000000  02000000 00000000
  03000000 92100000 37fa0000 02000000 15cd5b0700000000 0a00 05 00 0123456789abcdef0123456789abcdef 7765622d31
  04000000 88130000 00000000 01000000 0100000000000000 0500 00 00 00000000000000000000000000000000`);
// HOST_UPDATE with VMS_CHANGED (flags bit 0): u64 t_ns, u64 unattributed_uj, u64 legacy ok/refused/
// failed, u64 last_sample_ns, u64 samples, u64 sample_failures, u32 connections, u32 vms, u32 npkg,
// u32 reserved, then per package u32 id, u32 reserved, u64 energy_uj. 80 + 2 x 16 = 112.
const HOST_UPDATE = hex(`8600 0100 70000000
  00f2052a01000000 6300000000000000 0100000000000000 0200000000000000 0300000000000000
  a00f000000000000 0500000000000000 0600000000000000 07000000 08000000 02000000 00000000
  00000000 00000000 15cd5b0700000000
  01000000 00000000 2a00000000000000`);
// The same with FLAG_PER_PACKAGE too (flags 0x3): each package entry is 24 bytes, its unattributed
// energy after its energy: u32 id, u32 reserved, u64 energy_uj, u64 unattributed_uj. 80 + 2 x 24 = 128.
// Package 0: 123456789 µJ of which 90 µJ unattributed; package 1: 42 µJ of which 9.
const HOST_UPDATE_PER_PACKAGE = hex(`8600 0300 80000000
  00f2052a01000000 6300000000000000 0100000000000000 0200000000000000 0300000000000000
  a00f000000000000 0500000000000000 0600000000000000 07000000 08000000 02000000 00000000
  00000000 00000000 15cd5b0700000000 5a00000000000000
  01000000 00000000 2a00000000000000 0900000000000000`);

// The other RAPL domains (docs/protocol-v2.md, "Other RAPL domains"). SUBSCRIBE and OBSERVE with flags
// bit 0, HOST_SUBSCRIBE with bits 0 and 1 (per package and domains).
const SUBSCRIBE_DOMAINS = hex('0300 0100 04000000  07000000');
const OBSERVE_DOMAINS = hex('0600 0100 04000000  09000000');
const HOST_SUBSCRIBE_DOMAINS = hex('0800 0300 00000000');
// UPDATE with ENDED and DOMAINS (flags 0x3): the UPDATE above, then u32 ndomains 2, u32 reserved, and
// per domain u32 code (dram 3, psys 4), u32 reserved, one u64 energy_uj per vpkg. 48 + 8 + 2 x 24 = 104.
const UPDATE_DOMAINS =
  hex(`8300 0300 68000000  07000000 02000000 00f2052a01000000  0100000000000000 3d00000000000000  ffffffff00000000 0000000001000000
  02000000 00000000
  03000000 00000000 0a00000000000000 1400000000000000
  04000000 00000000 1e00000000000000 0000000002000000`);

// HOST_UPDATE_PER_PACKAGE's fields with DOMAINS too (flags 0x7): after the package entries, u32 count 3,
// u32 reserved, then per entry u32 package, u32 domain code, u64 energy_uj, u64 unattributed_uj:
// package 0 dram 1000 (100 unattributed), package 0 psys 5000 (500), package 1 dram 2000 (200).
// 128 + 8 + 3 x 24 = 208.
const HOST_UPDATE_DOMAINS = hex(`8600 0700 d0000000
  00f2052a01000000 6300000000000000 0100000000000000 0200000000000000 0300000000000000
  a00f000000000000 0500000000000000 0600000000000000 07000000 08000000 02000000 00000000
  00000000 00000000 15cd5b0700000000 5a00000000000000
  01000000 00000000 2a00000000000000 0900000000000000
  03000000 00000000
  00000000 03000000 e803000000000000 6400000000000000
  00000000 04000000 8813000000000000 f401000000000000
  01000000 03000000 d007000000000000 c800000000000000`);

describe('v2 client -> helper frames match hand-written bytes', () => {
  it('SUBSCRIBE vm 7 and OBSERVE vm 9 asking for the other domains set flags bit 0; HOST_SUBSCRIBE asking for both sets 0x3', () => {
    expect(encodeSubscribe(7, { domains: true }).equals(SUBSCRIBE_DOMAINS)).toBe(true);
    expect(parseClientFrame(oneFrame(SUBSCRIBE_DOMAINS, CLIENT_TYPES))).toEqual({
      ok: true,
      value: { type: 0x03, vmId: 7, domains: true },
    });
    expect(encodeObserve(9, { domains: true }).equals(OBSERVE_DOMAINS)).toBe(true);
    expect(parseClientFrame(oneFrame(OBSERVE_DOMAINS, CLIENT_TYPES))).toEqual({ ok: true, value: { type: 0x06, vmId: 9, domains: true } });
    expect(encodeHostSubscribe({ perPackage: true, domains: true }).equals(HOST_SUBSCRIBE_DOMAINS)).toBe(true);
    expect(parseClientFrame(oneFrame(HOST_SUBSCRIBE_DOMAINS, CLIENT_TYPES))).toEqual({
      ok: true,
      value: { type: 0x08, perPackage: true, domains: true },
    });
  });

  it('REGISTER pid 4242 with tids 4250 (vpkg 0) and 4251 (vpkg 1)', () => {
    const vcpus = [
      { tid: 4250, vpkg: 0 },
      { tid: 4251, vpkg: 1 },
    ];
    expect(encodeRegister({ pid: 4242, vcpus }).equals(REGISTER)).toBe(true);
    expect(parseClientFrame(oneFrame(REGISTER, CLIENT_TYPES))).toEqual({ ok: true, value: { type: 0x01, pid: 4242, vcpus } });
  });

  it('READ vm 7 vpkg 1, SUBSCRIBE vm 7, UNREGISTER vm 0x01020304', () => {
    expect(encodeRead(7, 1).equals(READ)).toBe(true);
    expect(parseClientFrame(oneFrame(READ, CLIENT_TYPES))).toEqual({ ok: true, value: { type: 0x02, vmId: 7, vpkg: 1 } });
    expect(encodeSubscribe(7).equals(SUBSCRIBE)).toBe(true);
    expect(parseClientFrame(oneFrame(SUBSCRIBE, CLIENT_TYPES))).toEqual({ ok: true, value: { type: 0x03, vmId: 7, domains: false } });
    expect(encodeU32Frame(T.UNREGISTER, 0x01020304).equals(UNREGISTER)).toBe(true);
    expect(parseClientFrame(oneFrame(UNREGISTER, CLIENT_TYPES))).toEqual({ ok: true, value: { type: 0x04, vmId: 0x01020304 } });
  });

  it('HOST_SUBSCRIBE asking for per-package unattributed energy sets flags bit 0, payload still empty', () => {
    expect(encodeHostSubscribe({ perPackage: true }).equals(HOST_SUBSCRIBE_PER_PACKAGE)).toBe(true);
    expect(parseClientFrame(oneFrame(HOST_SUBSCRIBE_PER_PACKAGE, CLIENT_TYPES))).toEqual({
      ok: true,
      value: { type: 0x08, perPackage: true, domains: false },
    });
  });

  it('LIST from id 7, OBSERVE vm 9, UNOBSERVE vm 0x01020304, HOST_SUBSCRIBE (empty payload)', () => {
    expect(encodeU32Frame(T.LIST, 7).equals(LIST)).toBe(true);
    expect(parseClientFrame(oneFrame(LIST, CLIENT_TYPES))).toEqual({ ok: true, value: { type: 0x05, fromId: 7 } });
    expect(encodeObserve(9).equals(OBSERVE)).toBe(true);
    expect(parseClientFrame(oneFrame(OBSERVE, CLIENT_TYPES))).toEqual({ ok: true, value: { type: 0x06, vmId: 9, domains: false } });
    expect(encodeU32Frame(T.UNOBSERVE, 0x01020304).equals(UNOBSERVE)).toBe(true);
    expect(parseClientFrame(oneFrame(UNOBSERVE, CLIENT_TYPES))).toEqual({ ok: true, value: { type: 0x07, vmId: 0x01020304 } });
    expect(encodeHostSubscribe().equals(HOST_SUBSCRIBE)).toBe(true);
    expect(parseClientFrame(oneFrame(HOST_SUBSCRIBE, CLIENT_TYPES))).toEqual({
      ok: true,
      value: { type: 0x08, perPackage: false, domains: false },
    });
  });

  it('LIMIT of vm 7 to 35.5 W sets flags bit 0; LIMIT read of vm 7 has flags 0; LIMIT_STATE carries the limit, quota, period and time limited', () => {
    // type 0x000a, flags 1, length 8; vm 7, 35500 mW.
    const set = hex('0a00 0100 08000000 07000000 ac8a0000');
    expect(encodeLimit(7, 35500).equals(set)).toBe(true);
    expect(parseClientFrame(oneFrame(set, CLIENT_TYPES))).toEqual({ ok: true, value: { type: 0x0a, vmId: 7, milliwatts: 35500 } });
    const read = hex('0a00 0000 08000000 07000000 00000000');
    expect(encodeLimit(7).equals(read)).toBe(true);
    expect(parseClientFrame(oneFrame(read, CLIENT_TYPES))).toEqual({ ok: true, value: { type: 0x0a, vmId: 7, milliwatts: null } });
    // type 0x0088, length 24: vm 7, 35500 mW, quota 50000 us, period 100000 us, 3 s limited.
    const state = hex('8800 0000 18000000 07000000 ac8a0000 50c30000 a0860100 005ed0b200000000');
    const value = { vmId: 7, limitMw: 35500, quotaUs: 50000, periodUs: 100000, limitedNs: 3_000_000_000n };
    expect(encodeLimitState(value).equals(state)).toBe(true);
    expect(parseHelperFrame(oneFrame(state, HELPER_TYPES))).toEqual({ ok: true, value: { type: 0x88, ...value } });
  });

  it('LIMIT naming a domain sets flags bit 1 and carries its code after the milliwatts; LIMIT_STATE then sets bit 0 and names it; a code past the list is refused', () => {
    // type 0x000a, flags 3 (set, domain), length 12; vm 7, 4500 mW, domain 3 (dram).
    const set = hex('0a00 0300 0c000000 07000000 94110000 03000000');
    expect(encodeLimit(7, 4500, 'dram').equals(set)).toBe(true);
    expect(parseClientFrame(oneFrame(set, CLIENT_TYPES))).toEqual({
      ok: true,
      value: { type: 0x0a, vmId: 7, milliwatts: 4500, domain: 'dram' },
    });
    // A read of vm 7's core limit (domain 1): flags 2; the package named explicitly is code 0.
    for (const [code, domain] of [
      [1, 'core'],
      [0, 'package'],
      [4, 'psys'],
    ] as const) {
      const read = hex(`0a00 0200 0c000000 07000000 00000000 0${code}000000`);
      expect(encodeLimit(7, undefined, domain).equals(read)).toBe(true);
      expect(parseClientFrame(oneFrame(read, CLIENT_TYPES))).toEqual({
        ok: true,
        value: { type: 0x0a, vmId: 7, milliwatts: null, domain },
      });
    }
    for (const bad of [
      '0a00 0200 0c000000 07000000 00000000 05000000',
      '0a00 0200 08000000 07000000 00000000',
      '0a00 0400 08000000 07000000 00000000',
    ]) {
      const r = parseClientFrame(oneFrame(hex(bad), CLIENT_TYPES));
      expect(r.ok).toBe(false);
    }
    // type 0x0088, flags 1, length 32: vm 7, 4500 mW, quota 50000 us, period 100000 us, 3 s limited, domain 3, reserved 0.
    const state = hex('8800 0100 20000000 07000000 94110000 50c30000 a0860100 005ed0b200000000 03000000 00000000');
    const value = { vmId: 7, limitMw: 4500, quotaUs: 50000, periodUs: 100000, limitedNs: 3_000_000_000n, domain: 'dram' as const };
    expect(encodeLimitState(value).equals(state)).toBe(true);
    expect(parseHelperFrame(oneFrame(state, HELPER_TYPES))).toEqual({ ok: true, value: { type: 0x88, ...value } });
    expect(
      parseHelperFrame(oneFrame(hex('8800 0100 18000000 07000000 94110000 50c30000 a0860100 005ed0b200000000'), HELPER_TYPES)).ok,
    ).toBe(false);
  });

  it('the connection starts with the magic 56 4D 53 32 ("VMS2")', () => {
    expect(V2_MAGIC.equals(hex('564d5332'))).toBe(true);
    expect(classifyPreamble(hex('564d5332'))).toBe('v2');
    expect(classifyPreamble(hex('11060000'))).toBe('legacy');
  });
});

describe('v2 helper -> client frames match hand-written bytes', () => {
  it('REGISTERED vm 7, 2 virtual packages, power unit 0xa0e03', () => {
    expect(encodeRegistered(7, 2, 0xa0e03n).equals(REGISTERED)).toBe(true);
    expect(parseHelperFrame(oneFrame(REGISTERED, HELPER_TYPES))).toEqual({
      ok: true,
      value: { type: 0x81, vmId: 7, nvpkg: 2, powerUnit: 0xa0e03n },
    });
  });

  it('VALUE with the ended flag (bit 0 of flags) and every u64 field at its offset', () => {
    const v = { counter: 0x12345678n, energyUj: 1_000_000n };
    expect(encodeValue(7, 1, v, 0x0102030405060708n, true).equals(VALUE_ENDED)).toBe(true);
    expect(parseHelperFrame(oneFrame(VALUE_ENDED, HELPER_TYPES))).toEqual({
      ok: true,
      value: { type: 0x82, vmId: 7, vpkg: 1, ...v, tNs: 0x0102030405060708n, ended: true },
    });
  });

  it('UPDATE with two virtual packages in vpkg order, t_ns 5 s', () => {
    const vpkgs = [
      { counter: 1n, energyUj: 61n },
      { counter: 0xffffffffn, energyUj: 0x1_0000_0000n },
    ];
    expect(encodeUpdate(7, 5_000_000_000n, vpkgs, false).equals(UPDATE)).toBe(true);
    expect(parseHelperFrame(oneFrame(UPDATE, HELPER_TYPES))).toEqual({
      ok: true,
      value: { type: 0x83, vmId: 7, tNs: 5_000_000_000n, vpkgs, ended: false },
    });
  });

  it('UPDATE with the other domains (flags bit 1) and ENDED: the domain block after the vpkg values', () => {
    const vpkgs = [
      { counter: 1n, energyUj: 61n },
      { counter: 0xffffffffn, energyUj: 0x1_0000_0000n },
    ];
    const domains = [
      { domain: 'dram' as const, vpkgEnergyUj: [10n, 20n] },
      { domain: 'psys' as const, vpkgEnergyUj: [30n, 0x2_0000_0000n] },
    ];
    expect(encodeUpdate(7, 5_000_000_000n, vpkgs, true, domains).equals(UPDATE_DOMAINS)).toBe(true);
    expect(parseHelperFrame(oneFrame(UPDATE_DOMAINS, HELPER_TYPES))).toEqual({
      ok: true,
      value: { type: 0x83, vmId: 7, tNs: 5_000_000_000n, vpkgs, ended: true, domains },
    });
  });

  it('OK vm 7, and ERROR code 4 (limit) answering a REGISTER with the UTF-8 text "limit"', () => {
    expect(encodeU32Frame(T.OK, 7).equals(OK)).toBe(true);
    expect(parseHelperFrame(oneFrame(OK, HELPER_TYPES))).toEqual({ ok: true, value: { type: 0x84, vmId: 7 } });
    expect(encodeError(4, 0x01, 'limit').equals(ERROR)).toBe(true);
    expect(parseHelperFrame(oneFrame(ERROR, HELPER_TYPES))).toEqual({
      ok: true,
      value: { type: 0xff, code: 4, requestType: 0x01, message: 'limit' },
    });
  });
});

describe('v2 observer replies match hand-written bytes', () => {
  it('VM_LIST of a discovered VM with name and UUID, and an ended whole-VM-only VM with neither', () => {
    const entries = [
      {
        hostVmId: 3,
        pid: 4242,
        uid: 64055,
        nvpkg: 2,
        starttime: 123456789n,
        ended: false,
        discovered: true,
        wholeVmOnly: false,
        notWhole: false,
        guestExact: false,
        name: 'web-1',
        uuid: hex('0123456789abcdef0123456789abcdef'),
      },
      {
        hostVmId: 4,
        pid: 5000,
        uid: 0,
        nvpkg: 1,
        starttime: 1n,
        ended: true,
        discovered: false,
        wholeVmOnly: true,
        notWhole: false,
        guestExact: false,
        name: null,
        uuid: null,
      },
    ];
    expect(encodeVmList(entries).equals(VM_LIST)).toBe(true);
    expect(parseHelperFrame(oneFrame(VM_LIST, HELPER_TYPES))).toEqual({ ok: true, value: { type: 0x85, entries, nextId: 0 } });
  });

  it('HOST_UPDATE with two packages, every health figure at its offset, VMs changed', () => {
    const h = {
      tNs: 5_000_000_000n,
      unattributedUj: 99n,
      packages: [
        { pkg: 0, energyUj: 123456789n, unattributedUj: null },
        { pkg: 1, energyUj: 42n, unattributedUj: null },
      ],
      vmsChanged: true,
      stats: {
        legacyOk: 1n,
        legacyRefused: 2n,
        legacyFailed: 3n,
        lastSampleDurationNs: 4000n,
        samples: 5n,
        sampleFailures: 6n,
        connections: 7,
        vms: 8,
      },
    };
    expect(encodeHostUpdate(h).equals(HOST_UPDATE)).toBe(true);
    expect(parseHelperFrame(oneFrame(HOST_UPDATE, HELPER_TYPES))).toEqual({ ok: true, value: { type: 0x86, ...h } });
  });

  it('HOST_UPDATE with per-package unattributed energy (flags bit 1): 24-byte package entries', () => {
    const h = {
      tNs: 5_000_000_000n,
      unattributedUj: 99n,
      packages: [
        { pkg: 0, energyUj: 123456789n, unattributedUj: 90n },
        { pkg: 1, energyUj: 42n, unattributedUj: 9n },
      ],
      vmsChanged: true,
      stats: {
        legacyOk: 1n,
        legacyRefused: 2n,
        legacyFailed: 3n,
        lastSampleDurationNs: 4000n,
        samples: 5n,
        sampleFailures: 6n,
        connections: 7,
        vms: 8,
      },
    };
    expect(encodeHostUpdate(h).equals(HOST_UPDATE_PER_PACKAGE)).toBe(true);
    expect(parseHelperFrame(oneFrame(HOST_UPDATE_PER_PACKAGE, HELPER_TYPES))).toEqual({ ok: true, value: { type: 0x86, ...h } });
    const d = {
      ...h,
      domains: [
        { pkg: 0, domain: 'dram' as const, energyUj: 1000n, unattributedUj: 100n },
        { pkg: 0, domain: 'psys' as const, energyUj: 5000n, unattributedUj: 500n },
        { pkg: 1, domain: 'dram' as const, energyUj: 2000n, unattributedUj: 200n },
      ],
    };
    expect(encodeHostUpdate(d).equals(HOST_UPDATE_DOMAINS)).toBe(true);
    expect(parseHelperFrame(oneFrame(HOST_UPDATE_DOMAINS, HELPER_TYPES))).toEqual({ ok: true, value: { type: 0x86, ...d } });
  });
});

describe('legacy (QEMU rapl-helper-socket) matches hand-written bytes', () => {
  // request: u32 msr, u32 cpu, u32 tid; reply: u64 value
  const REQUEST = hex('11060000 03000000 9a100000');
  const REPLY = hex('efbeadde 78563412');

  it('a request for MSR 0x611 on cpu 3 from tid 4250', () => {
    expect(encodeLegacyRequest({ msr: 0x611, cpu: 3, tid: 4250 }).equals(REQUEST)).toBe(true);
    const f = new LegacyFramer();
    const got = [...REQUEST].flatMap((b) => f.push(Buffer.from([b])));
    expect(got).toEqual([{ msr: 0x611, cpu: 3, tid: 4250 }]);
    expect(f.incomplete).toHaveLength(0);
  });

  it('the AMD energy register number survives as an unsigned u32', () => {
    const amd = hex('9b0201c0 00000000 01000000');
    expect(encodeLegacyRequest({ msr: 0xc001029b, cpu: 0, tid: 1 }).equals(amd)).toBe(true);
    expect(new LegacyFramer().push(amd)).toEqual([{ msr: 0xc001029b, cpu: 0, tid: 1 }]);
  });

  it('a reply of 0x12345678deadbeef, and 0 (the refusal QEMU sees), as the legacy service writes them', () => {
    const fake = new FakeHost();
    const device = new MsrDevice(fake.msrPathTemplate);
    try {
      fake.writeMsr(1, 0x611, 0x12345678deadbeefn);
      const legacy = legacyOnFakeHost(fake, device, pino({ level: 'silent' }));
      const peer = { pid: process.pid, uid: 0, gid: 0 };
      const out = Buffer.alloc(16, 0xff);
      expect(legacy.answer(peer, { msr: 0x611, cpu: 1, tid: process.pid }, legacy.verdictsFor(process.pid), out, 0)).toBe(true);
      // cpu 7 is not online: refused with 0
      expect(legacy.answer(peer, { msr: 0x611, cpu: 7, tid: process.pid }, legacy.verdictsFor(process.pid), out, 8)).toBe(true);
      expect(out.equals(Buffer.concat([REPLY, hex('00000000 00000000')]))).toBe(true);
    } finally {
      device.close();
      fake.cleanup();
    }
  });
});
