/** The state snapshot codec: what goes in comes out, and each kind of damaged or hostile snapshot is refused by name. */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import zlib from 'node:zlib';
import { freshGuestCounter } from '../../src/guest-energy/guest-counter.js';
import { decodeState, encodeState, STATE_FORMAT_VERSION, stateProblem } from '../../src/state/snapshot-codec.js';
import { STATE_HEADER_SIZE } from '../../src/state/byte-io.js';
import { STATE_LIMITS, type StateSnapshot, type VmState } from '../../src/state/snapshot.js';
import { MAX_TID, MAX_VCPUS, MAX_VPKG } from '../../src/model/vcpus.js';
import { vmOwnershipArbitraries } from '../support/state-arbitraries.js';

const u64 = fc.bigInt({ min: 0n, max: (1n << 64n) - 1n });
const pid = fc.integer({ min: 1, max: MAX_TID });
const starttime = fc.nat({ max: Number.MAX_SAFE_INTEGER });
const uj = (j: number): bigint => BigInt(Math.floor(j * 1e6));
/** Joules as the engine keeps them (float64, finite, >= 0, up to what u64 µJ holds) and the µJ published from them. */
const joules = fc.double({ min: 0, max: 1.8e13, noNaN: true, noDefaultInfinity: true });
const totals = fc
  .record({ energyJ: joules, counter: fc.bigInt({ min: 0n, max: 0xffffffffn }) })
  .map((v) => ({ ...v, energyUj: uj(v.energyJ) }));

const vm = (hostVmId: number): fc.Arbitrary<VmState> =>
  fc.integer({ min: 1, max: 4 }).chain((nvpkg) =>
    fc
      .record({
        hostVmId: fc.constant(hostVmId),
        pid,
        starttime,
        ...vmOwnershipArbitraries,
        name: fc.option(fc.string({ maxLength: 40, unit: 'binary' }), { nil: null }),
        valuesNs: u64,
        endedSamples: fc.nat({ max: 0xffffffff }),
        vcpus: fc.uniqueArray(fc.record({ tid: pid, vpkg: fc.nat({ max: nvpkg - 1 }) }), { selector: (v) => v.tid, maxLength: 8 }),
        vpkgs: fc.array(totals, { minLength: nvpkg, maxLength: nvpkg }),
      })
      .map((v) => ({ ...v, discovered: v.discovered || v.owner === null, baseline: v.baseline && v.live })),
  );

const snapshot: fc.Arbitrary<StateSnapshot> = fc
  .uniqueArray(fc.integer({ min: 1, max: 0xfffffffe }), { maxLength: 6 })
  .chain((ids) =>
    fc.record({
      nextHostVmId: fc.integer({ min: Math.max(0, ...ids) + 1, max: 0xffffffff }),
      vms: ids.length === 0 ? fc.constant<VmState[]>([]) : fc.tuple(...ids.map(vm)).map((t): VmState[] => t),
      packages: fc.uniqueArray(
        fc
          .record({ pkg: fc.nat({ max: 0xffffffff }), energyJ: joules, unattributedJ: joules })
          .map((k) => ({ ...k, energyUj: uj(k.energyJ), unattributedUj: uj(k.unattributedJ) })),
        { selector: (k) => k.pkg, maxLength: 4 },
      ),
      knownPids: fc.uniqueArray(fc.record({ pid, starttime }), { selector: (k) => k.pid, maxLength: 6 }),
      lastSample: fc.option(
        fc.record({
          monotonicNs: u64,
          realtimeNs: u64,
          packages: fc.uniqueArray(fc.record({ pkg: fc.nat({ max: 0xffffffff }), raw: u64 }), { selector: (k) => k.pkg, maxLength: 4 }),
          threads: fc.uniqueArray(fc.record({ pid, tid: pid, starttime, ticks: u64 }), { selector: (t) => t.tid, maxLength: 10 }),
        }),
        { nil: null },
      ),
    }),
  )
  // A VM has its baseline only when there is a last sample, and its values are not from after it.
  .map((s) => ({
    ...s,
    vms: s.vms.map((v) => ({
      ...v,
      baseline: v.baseline && s.lastSample !== null,
      valuesNs: s.lastSample !== null && v.valuesNs > s.lastSample.monotonicNs ? s.lastSample.monotonicNs : v.valuesNs,
    })),
  }));

function sample(): StateSnapshot {
  return {
    nextHostVmId: 3,
    vms: [
      {
        hostVmId: 1,
        pid: 4242,
        starttime: 123456,
        uid: 107,
        owner: 7,
        discovered: true,
        name: 'guest-ü',
        uuid: Buffer.alloc(16, 0xab),
        wholeVmOnly: false,
        live: true,
        baseline: true,
        valuesNs: 1_000_000_000n,
        endedSamples: 0,
        vcpus: [
          { tid: 4243, vpkg: 0 },
          { tid: 4244, vpkg: 1 },
        ],
        vpkgs: [
          { energyJ: 10, energyUj: 10_000_000n, counter: 163840n },
          { energyJ: 20.0000015, energyUj: 20_000_001n, counter: 327680n },
        ],
      },
      {
        hostVmId: 2,
        pid: 99,
        starttime: 5,
        uid: 0,
        owner: null,
        discovered: true,
        name: null,
        uuid: null,
        wholeVmOnly: true,
        live: false,
        baseline: false,
        valuesNs: 0n,
        endedSamples: 2,
        vcpus: [],
        vpkgs: [{ energyJ: 0, energyUj: 0n, counter: 0n }],
      },
    ],
    packages: [{ pkg: 0, energyJ: 50, unattributedJ: 20, energyUj: 50_000_000n, unattributedUj: 20_000_000n }],
    knownPids: [{ pid: 99, starttime: 5 }],
    lastSample: {
      monotonicNs: 1_000_000_000n,
      realtimeNs: 1_700_000_000_000_000_000n,
      packages: [{ pkg: 0, raw: 0xdeadbeefn }],
      threads: [{ pid: 4242, tid: 4243, starttime: 123460, ticks: 77n }],
    },
  };
}

/** The bytes of `s` with the header's checksum made right again after the payload was edited. */
function resum(bytes: Buffer): Buffer {
  bytes.writeUInt32LE(zlib.crc32(bytes.subarray(STATE_HEADER_SIZE)), 16);
  return bytes;
}

/** What each older writer did not write, at the end of a snapshot with none of it: the power limits (one empty count) before version 4, the guest counters (one) before 3, the other domains (three) before 2. */
const EMPTY_SINCE: Record<number, number> = { 4: 4, 3: 4, 2: 12 };

/** The bytes a version `v` writer gave for a snapshot without the sections added after it. */
function asVersion(v: number, current: Buffer): Buffer {
  let cut = 0;
  for (let k = v + 1; k <= STATE_FORMAT_VERSION; k++) cut += EMPTY_SINCE[k]!;
  const old = Buffer.from(current.subarray(0, current.length - cut));
  old.writeUInt32LE(v, 8);
  old.writeUInt32LE(old.length - STATE_HEADER_SIZE, 12);
  return resum(old);
}
const asVersion2 = (b: Buffer) => asVersion(2, b);
const asVersion1 = (b: Buffer) => asVersion(1, b);

/** sample() with other-domain totals and counters: DRAM for both VMs' first vpkg and package 0, psys. */
function withDomains(): StateSnapshot {
  const s = sample();
  s.domains = {
    vms: [
      { hostVmId: 1, domain: 'dram', energyJ: [1.5] },
      { hostVmId: 1, domain: 'psys', energyJ: [0.25] },
    ],
    packages: [
      { pkg: 0, domain: 'dram', energyJ: 20.5, unattributedJ: 3 },
      { pkg: 0, domain: 'psys', energyJ: 90, unattributedJ: 10 },
    ],
    counters: s.lastSample
      ? [
          { pkg: 0, domain: 'dram', raw: 0x1234n },
          { pkg: 0, domain: 'psys', raw: 0x99n },
        ]
      : [],
  };
  return s;
}

const refusal = (bytes: Buffer): string => {
  const r = decodeState(bytes);
  if (r.ok) throw new Error('decoded');
  return r.error;
};

describe('state snapshot codec', () => {
  it('round-trips any snapshot that keeps the rules', () => {
    fc.assert(
      fc.property(snapshot, (s) => {
        expect(stateProblem(s)).toBeNull();
        const r = decodeState(encodeState(s));
        expect(r).toEqual({ ok: true, value: s });
      }),
      { numRuns: 200 },
    );
  });

  it('round-trips a hand-made snapshot, names in UTF-8 and ids kept', () => {
    const bytes = encodeState(sample());
    expect(bytes.subarray(0, 8).toString('latin1')).toBe('VMSRSTAT');
    expect(bytes.readUInt32LE(8)).toBe(STATE_FORMAT_VERSION);
    expect(bytes.readUInt32LE(12)).toBe(bytes.length - STATE_HEADER_SIZE);
    expect(decodeState(bytes)).toEqual({ ok: true, value: sample() });
  });

  it('refuses a wrong magic, an unknown version, a bad checksum, and says what to do', () => {
    const magic = encodeState(sample());
    magic.write('VMSRSTAX', 0, 'latin1');
    expect(refusal(magic)).toMatch(
      /^cannot restore state: it does not start with VMSRSTAT: it is not a vmsr-helper state snapshot; start without the saved state/,
    );
    const version = encodeState(sample());
    version.writeUInt32LE(5, 8);
    expect(refusal(version)).toMatch(
      /it is format version 5, this vmsr-helper reads versions 1, 2, 3 and 4; run the vmsr-helper that wrote it/,
    );
    const damaged = encodeState(sample());
    damaged[damaged.length - 1]! ^= 1;
    expect(refusal(damaged)).toMatch(/its checksum does not match .*: it was damaged/);
  });

  it('refuses truncation, trailing bytes, a length past the bound, a short header', () => {
    const bytes = encodeState(sample());
    expect(refusal(bytes.subarray(0, bytes.length - 1))).toMatch(/it is cut off: \d+ of the \d+ bytes its header announces/);
    expect(refusal(Buffer.concat([bytes, Buffer.from([0])]))).toMatch(/1 bytes follow the \d+ its header announces/);
    const huge = Buffer.from(bytes);
    huge.writeUInt32LE(STATE_LIMITS.maxPayloadBytes + 1, 12);
    expect(refusal(huge)).toMatch(/its header announces 67108865 bytes, at most 67108864/);
    expect(refusal(bytes.subarray(0, 10))).toMatch(/shorter than its 24-byte header/);
  });

  it('refuses a payload whose length field and checksum agree but whose entries run past it, or stop before it', () => {
    const bytes = asVersion1(encodeState(sample()));
    // The last thread's ticks lose their last 4 bytes; length and checksum are made right, so only the structure tells.
    const short = Buffer.from(bytes.subarray(0, bytes.length - 4));
    short.writeUInt32LE(short.length - STATE_HEADER_SIZE, 12);
    expect(refusal(resum(short))).toMatch(/it is cut off in the 1 sampled threads it announces/);
    const extra = encodeState(sample());
    const longer = Buffer.concat([extra, Buffer.alloc(4)]);
    longer.writeUInt32LE(longer.length - STATE_HEADER_SIZE, 12);
    expect(refusal(resum(longer))).toMatch(/4 bytes follow the last entry/);
  });

  it('refuses counts past their bounds before reading their entries', () => {
    const bytes = encodeState(sample());
    bytes.writeUInt32LE(STATE_LIMITS.maxVms + 1, STATE_HEADER_SIZE + 4);
    expect(refusal(resum(bytes))).toMatch(/it has 100001 VMs, at most 100000/);
    const many = encodeState({ ...sample(), vms: [], nextHostVmId: 1 });
    many.writeUInt32LE(4000, STATE_HEADER_SIZE + 8);
    expect(refusal(resum(many))).toMatch(/cut off in the 4000 packages it announces/);
    many.writeUInt32LE(STATE_LIMITS.maxPackages + 1, STATE_HEADER_SIZE + 8);
    expect(refusal(resum(many))).toMatch(/it has 4097 packages, at most 4096/);
  });

  it('refuses out-of-range values and duplicate ids, and the encoder refuses them too', () => {
    const cases: [string, (s: StateSnapshot) => void, RegExp][] = [
      ['a pid past MAX_TID', (s) => (s.vms[0]!.pid = MAX_TID + 1), /VM 1: pid 2147483648 is out of range/],
      ['a vpkg past MAX_VPKG', (s) => (s.vms[0]!.vcpus[0]!.vpkg = MAX_VPKG + 1), /virtual package 256 is out of range/],
      ['a vCPU in a package the VM lacks', (s) => (s.vms[0]!.vcpus[0]!.vpkg = 2), /thread 4243 is in virtual package 2, the VM has 2/],
      ['a tid twice', (s) => (s.vms[0]!.vcpus[1]!.tid = 4243), /thread 4243 is listed twice/],
      ['a VM id twice', (s) => (s.vms[1]!.hostVmId = 1), /VM id 1 appears twice/],
      ['a VM id at or past the next id', (s) => (s.nextHostVmId = 2), /VM id 2 is out of range \(1..1, below the next id 2\)/],
      [
        'a package twice',
        (s) => s.packages.push({ pkg: 0, energyJ: 0, unattributedJ: 0, energyUj: 0n, unattributedUj: 0n }),
        /package 0 appears twice in the totals/,
      ],
      ['a known pid twice', (s) => s.knownPids.push({ pid: 99, starttime: 6 }), /known process 99 appears twice/],
      [
        'a sampled thread twice',
        (s) => s.lastSample!.threads.push({ pid: 4242, tid: 4243, starttime: 1, ticks: 1n }),
        /thread 4243 appears twice in the last sample/,
      ],
      [
        'joules and µJ that disagree',
        (s) => (s.vms[0]!.vpkgs[1]!.energyUj = 20_000_000n),
        /VM 1, virtual package 1: 20.0000015 J does not give 20000000 µJ/,
      ],
      ['a total that is not a number', (s) => (s.packages[0]!.unattributedJ = Number.NaN), /package 0: its totals in J and µJ disagree/],
      [
        'a baseline without a last sample',
        (s) => (s.lastSample = null),
        /VM 1 is marked as having its baseline, but there is no last sample/,
      ],
      ['an ended VM with a baseline', (s) => (s.vms[0]!.live = false), /VM 1 has ended but is marked as having its baseline/],
      [
        'values from after the last sample',
        (s) => (s.vms[1]!.valuesNs = 2_000_000_000n),
        /VM 2: its values' time 2000000000 ns is after the last sample/,
      ],
      ['a counter past 32 bits', (s) => (s.vms[0]!.vpkgs[0]!.counter = 1n << 32n), /counter 4294967296 is out of range/],
      [
        'a VM neither registered nor discovered',
        (s) => ((s.vms[0]!.discovered = false), (s.vms[0]!.owner = null)),
        /VM 1 is neither registered/,
      ],
      ['a name with a lone surrogate', (s) => (s.vms[0]!.name = 'a\ud800b'), /VM 1: its name is not valid Unicode/],
      [
        'too many vCPUs',
        (s) => (s.vms[0]!.vcpus = Array.from({ length: MAX_VCPUS + 1 }, (_, i) => ({ tid: i + 1, vpkg: 0 }))),
        /4097 entries, at most 4096/,
      ],
    ];
    for (const [, edit, want] of cases) {
      const s = sample();
      edit(s);
      expect(() => encodeState(s)).toThrow(want);
      expect(stateProblem(s)).toMatch(want);
    }
  });

  it('refuses, when writing, a value out of its field range, a list past its bound or an unknown code, by the field', () => {
    const cases: [(s: StateSnapshot) => void, RegExp][] = [
      [(s) => (s.vms[0]!.uid = 2 ** 32), /^cannot save state: VM 1: 4294967296 is out of range \(0..4294967295\)/],
      [(s) => (s.vms[1]!.starttime = 2 ** 53), /^cannot save state: VM 2's starttime: 9007199254740992 is out of range/],
      [(s) => (s.vms[0]!.name = 'x'.repeat(1025)), /^cannot save state: VM 1: its name is over 1024 bytes/],
      [
        (s) =>
          (s.packages = Array.from({ length: 4097 }, (_, pkg) => ({
            pkg,
            energyJ: 0,
            unattributedJ: 0,
            energyUj: 0n,
            unattributedUj: 0n,
          }))),
        /^cannot save state: it has 4097 packages, at most 4096/,
      ],
      [
        (s) => (s.domains = { vms: [{ hostVmId: 1, domain: 'package' as 'dram', energyJ: [] }], packages: [], counters: [] }),
        /^cannot save state: VM 1's other-domain totals has domain code 0, not a RAPL domain besides the package/,
      ],
    ];
    for (const [edit, want] of cases) {
      const s = sample();
      edit(s);
      expect(() => encodeState(s)).toThrow(want);
    }
  });

  it('decodes values the encoder would never write and refuses them by the same rule', () => {
    // A valid snapshot, then a pid of 0 written into the bytes: the decoder's check is the encoder's.
    const bytes = encodeState(sample());
    bytes.writeUInt32LE(0, STATE_HEADER_SIZE + 12);
    expect(refusal(resum(bytes))).toMatch(/^cannot restore state: VM 1: pid 0 is out of range \(1..2147483647\); start without/);
    const flags = encodeState(sample());
    flags.writeUInt8(0x80, STATE_HEADER_SIZE + 32);
    expect(refusal(resum(flags))).toMatch(/VM 1 has unknown flags 0x80/);
    const name = encodeState(sample());
    name.writeUInt8(0xff, STATE_HEADER_SIZE + 8 + 36 + 16);
    expect(refusal(resum(name))).toMatch(/VM 1: its name is not valid UTF-8/);
  });
});

describe('state snapshot codec, other RAPL domains', () => {
  it('reads a version 1 snapshot (written before the other domains) as the same snapshot without them', () => {
    const s = sample();
    const r = decodeState(asVersion1(encodeState(s)));
    expect(r.ok && r.value).toEqual(decodeState(encodeState(s)).ok && s);
    expect(r.ok && r.value.domains).toBeUndefined();
  });

  it('round-trips the other domains, and refuses a domain code that is not one, twice the same entry, or totals for a VM it lacks', () => {
    const s = withDomains();
    const r = decodeState(encodeState(s));
    expect(r.ok && r.value.domains).toEqual(s.domains);
    const bytes = encodeState(s);
    // The domains section is the end: three counts, 2 VM entries of one vpkg (16 bytes each), 2 package
    // entries (24), 2 counters (16). The first VM entry starts after the first count.
    const at = bytes.length - EMPTY_SINCE[4]! - EMPTY_SINCE[3]! - (4 + 16 * 2 + 4 + 24 * 2 + 4 + 16 * 2) + 4;
    const code = Buffer.from(bytes);
    code.writeUInt8(0, at + 4); // 'package'
    expect(refusal(resum(code))).toMatch(/domain code 0, not a RAPL domain besides the package/);
    code.writeUInt8(9, at + 4);
    expect(refusal(resum(code))).toMatch(/domain code 9, not a RAPL domain besides the package/);
    const twice = withDomains();
    twice.domains!.packages.push({ pkg: 0, domain: 'dram', energyJ: 1, unattributedJ: 0 });
    expect(stateProblem(twice)).toMatch(/package 0 has dram totals twice/);
    const stranger = withDomains();
    stranger.domains!.vms.push({ hostVmId: 77, domain: 'dram', energyJ: [1] });
    expect(stateProblem(stranger)).toMatch(/dram totals for VM 77, which the snapshot does not have/);
    const wide = withDomains();
    wide.domains!.vms[0]!.energyJ = [1, 2, 3, 4, 5, 6];
    expect(stateProblem(wide)).toMatch(/6 dram totals for \d+ virtual packages/);
  });
});

describe('state snapshot codec, guest counters (--guest-energy exact)', () => {
  const withGuest = (): StateSnapshot => {
    const s = sample();
    const g = freshGuestCounter(1, 4242, 123456, 2, 3.5);
    g.counters.set(0, 123_456_789);
    g.loop.eRatio.set(0, 1n << 63n);
    g.loop.nbVcpu.set(0, 4000);
    g.loop.vpkgCounter = [0xffff_fff0, 7];
    g.phases = { kind: 'start', startNs: 987_654_321_000n, pkgs: [0, 1], asked: 0 };
    g.start = new Map([[4243, { tid: 4243, ticks: 1234, starttime: 123460, pkg: -1 }]]);
    g.owedUnits = -2.5;
    g.creditedUnits = 5e9;
    g.windows = 77;
    g.carriedWindows = 3;
    s.guest = [g, freshGuestCounter(2, 4300, 5, 1, 0)];
    return s;
  };

  it('round-trips every field of the guest counters, and reads a version 2 snapshot as one without them', () => {
    const s = withGuest();
    const r = decodeState(encodeState(s));
    expect(r.ok && r.value.guest).toEqual(s.guest);
    const plain = sample();
    const v2 = decodeState(asVersion2(encodeState(plain)));
    expect(v2.ok && v2.value).toEqual(plain);
  });

  it('refuses a guest counter that is not a whole number or a number that is not finite, before writing it', () => {
    const s = withGuest();
    s.guest![0]!.counters.set(0, 1.5);
    expect(stateProblem(s)).toMatch(/VM 1: a guest counter 1.5 is out of range/);
    const t = withGuest();
    t.guest![1]!.owedUnits = NaN;
    expect(stateProblem(t)).toMatch(/VM 2: a guest counter holds a number that is not finite/);
  });
});

describe('state snapshot codec, power limits', () => {
  const withLimits = (): StateSnapshot => {
    const s = sample();
    s.limits = [
      {
        vmId: 1,
        pid: 4242,
        domain: 'package',
        limitW: 21.5,
        limitedS: 33.25,
        quotaCpus: 0.62,
        fromFile: true,
        groups: [
          { dir: '/sys/fs/cgroup/cpu/machine/vcpu0', saved: '-1\n', written: '31000\n', made: false },
          { dir: '/sys/fs/cgroup/cpu/vmsr-helper-vm-4242', saved: '150000\n', written: null, made: true },
        ],
      },
      { vmId: 2, pid: 4300, domain: 'package', limitW: 4_000_000, limitedS: 0, quotaCpus: null, fromFile: false, groups: [] },
      { vmId: 1, pid: 4242, domain: 'dram', limitW: 3.5, limitedS: 33.25, quotaCpus: null, fromFile: false, groups: [] },
    ];
    return s;
  };

  it('round-trips every field of the power limits, and reads a version 3 snapshot as one without them', () => {
    const s = withLimits();
    const r = decodeState(encodeState(s));
    expect(r.ok && r.value.limits).toEqual(s.limits);
    const plain = sample();
    const v3 = decodeState(asVersion(3, encodeState(plain)));
    expect(v3.ok && v3.value).toEqual(plain);
  });

  it('refuses a limit that is not a finite number above 0, a VM and domain twice, a relative group path or unprintable quota bytes, before writing it', () => {
    const edits: [(s: StateSnapshot) => void, RegExp][] = [
      [(s) => (s.limits![0]!.limitW = NaN), /the package power limit of VM 1: its limit or time limited is not a finite number above 0/],
      [(s) => (s.limits![1]!.quotaCpus = -1), /the package power limit of VM 2: its quota is not a finite number above 0/],
      [(s) => (s.limits![1]!.vmId = 1), /the package power limit of VM 1 appears twice/],
      [(s) => (s.limits![2]!.domain = 'package'), /the package power limit of VM 1 appears twice/],
      [(s) => (s.limits![0]!.groups[0]!.dir = 'machine/vcpu0'), /a group's path is not absolute/],
      [(s) => (s.limits![0]!.groups[1]!.saved = '1\u0000'), /a quota file's bytes are not printable or over 64/],
      [(s) => (s.limits![0]!.groups[0]!.written = 'x'.repeat(65)), /a quota file's bytes are not printable or over 64/],
    ];
    for (const [edit, msg] of edits) {
      const s = withLimits();
      edit(s);
      expect(stateProblem(s)).toMatch(msg);
      expect(() => encodeState(s)).toThrow(msg);
    }
  });
});
