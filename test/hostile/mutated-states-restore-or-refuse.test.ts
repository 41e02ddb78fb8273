/**
 * A handed-over state is hostile input (docs/security.md, "Damaged restart states"): decodeState
 * threw (RangeError: Infinity to BigInt) on 5 of 865,020 mutants whose CRC was fixed, instead of
 * refusing them, and 219,611 mutants it accepted had never been pushed through the restore. Here
 * restorable states are encoded, mutated (bytes, whole u32/u64/f64 fields, extremes), their CRC made
 * right again, and decoded: every one decodes or is refused by name, none throws; every one it
 * accepts goes through the real v2 chain's restore (assembleV2: planRestore, the engine, the
 * registry, discovery's adopt, the host totals) without an error: restored, or refused as a whole
 * by name (this host's counters, clock or /proc), and the service's next snapshot saves and reads.
 */
import fc from 'fast-check';
import zlib from 'node:zlib';
import { pino } from 'pino';
import { afterAll, describe, expect, it } from 'vitest';
import { assembleV2, type V2Chain } from '../../src/helper/assemble.js';
import { DEFAULT_V2_LIMITS } from '../../src/helper/v2/v2-limits.js';
import { decodeState, encodeState } from '../../src/state/snapshot-codec.js';
import { STATE_HEADER_SIZE } from '../../src/state/byte-io.js';
import type { StateSnapshot, VmState } from '../../src/state/snapshot.js';
import { monotonicNs } from '../../src/sampling/tick-loop.js';
import { MsrDevice } from '../../src/msr/device.js';
import { MAX_TID } from '../../src/model/vcpus.js';
import { FakeHost } from '../support/fake-host.js';
import { vmOwnershipArbitraries } from '../support/state-arbitraries.js';
import { freshGuestCounter, type GuestCounterState } from '../../src/guest-energy/guest-counter.js';

const POWER_UNIT = 0xa0e03n; // ESU 14: a counter unit is 2^-14 J
const UNIT_J = 2 ** -14;
/** Mutants decoded (the finding: 5 throws in 865,020); each run of the suite draws new ones. */
const DECODED_MUTANTS = 40_000;
/** Accepted mutants pushed through the whole restore (each builds a v2 service). */
const RESTORED_MUTANTS = 150;

const fake = new FakeHost({ packages: [0] });
fake.writeRapl({ powerUnit: POWER_UNIT, energy: { 0: 1000 } });
const device = new MsrDevice(fake.msrPathTemplate);
const log = pino({ level: 'silent' });
afterAll(() => {
  device.close();
  fake.cleanup();
});

const uj = (j: number): bigint => BigInt(Math.floor(j * 1e6));
const joules = fc.double({ min: 0, max: 1e9, noNaN: true, noDefaultInfinity: true });
const pid = fc.integer({ min: 1, max: MAX_TID });
/** Totals as this host's engine keeps them: the counter follows from the joules at its unit. */
const totals = joules.map((energyJ) => ({ energyJ, energyUj: uj(energyJ), counter: BigInt(Math.floor(energyJ / UNIT_J) % 2 ** 32) }));

/** One VM's guest counters (--guest-energy exact, state version 3), in a window with its start read. */
const guestCounter: fc.Arbitrary<GuestCounterState> = fc
  .record({
    vmId: fc.integer({ min: 1, max: 50 }),
    pid,
    starttime: fc.nat({ max: 2 ** 40 }),
    counter: fc.nat({ max: 2 ** 40 }),
    eRatio: fc.bigInt({ min: 0n, max: (1n << 64n) - 1n }),
    nbVcpu: fc.nat({ max: 0xffffffff }),
    vpkg: fc.nat({ max: 0xffffffff }),
    owed: fc.double({ min: -1e6, max: 1e9, noNaN: true, noDefaultInfinity: true }),
    credited: joules,
    windows: fc.nat({ max: 1e6 }),
    start: fc.option(
      fc.record({ tid: pid, ticks: fc.nat({ max: 2 ** 40 }), starttime: fc.nat({ max: 2 ** 40 }), pkg: fc.integer({ min: -1, max: 3 }) }),
      {
        nil: null,
      },
    ),
  })
  .map((r) => {
    const g = freshGuestCounter(r.vmId, r.pid, r.starttime, 1, r.credited);
    g.counters.set(0, r.counter);
    g.loop.eRatio.set(0, r.eRatio);
    g.loop.nbVcpu.set(0, r.nbVcpu);
    g.loop.vpkgCounter = [r.vpkg];
    g.phases = { kind: 'start', startNs: 1_000_000n, pkgs: [0], asked: 1 };
    g.start = r.start === null ? null : new Map([[r.start.tid, r.start]]);
    g.owedUnits = r.owed;
    g.creditedUnits = r.credited;
    g.windows = r.windows;
    return g;
  });

/** A state this host restores: its packages, a last sample not in the future, counters at its unit. */
function restorable(nowNs: bigint): fc.Arbitrary<StateSnapshot> {
  const vm = (hostVmId: number): fc.Arbitrary<VmState> =>
    fc.integer({ min: 1, max: 3 }).chain((n) =>
      fc
        .record({
          pid,
          starttime: fc.nat({ max: 2 ** 40 }),
          ...vmOwnershipArbitraries,
          name: fc.option(fc.string({ maxLength: 20 }), { nil: null }),
          endedSamples: fc.nat({ max: 100 }),
          vcpus: fc.uniqueArray(fc.record({ tid: pid, vpkg: fc.nat({ max: n - 1 }) }), { selector: (v) => v.tid, maxLength: 4 }),
          vpkgs: fc.array(totals, { minLength: n, maxLength: n }),
        })
        .map((v) => ({ ...v, hostVmId, discovered: v.discovered || v.owner === null, valuesNs: nowNs - 1_000_000n })),
    );
  return fc.uniqueArray(fc.integer({ min: 1, max: 50 }), { maxLength: 4 }).chain((ids) =>
    fc
      .record({
        vms: ids.length === 0 ? fc.constant<VmState[]>([]) : fc.tuple(...ids.map(vm)).map((t): VmState[] => t),
        pkg: fc.record({ energyJ: joules, unattributedJ: joules }),
        knownPids: fc.uniqueArray(fc.record({ pid, starttime: fc.nat({ max: 2 ** 40 }) }), { selector: (k) => k.pid, maxLength: 4 }),
        raw: fc.bigInt({ min: 0n, max: 0xffffffffn }),
        threads: fc.uniqueArray(
          fc.record({ pid, tid: pid, starttime: fc.nat({ max: 2 ** 40 }), ticks: fc.bigInt({ min: 0n, max: 1n << 40n }) }),
          {
            selector: (t) => t.tid,
            maxLength: 6,
          },
        ),
        dram: fc.option(joules, { nil: null }),
        guest: fc.array(guestCounter, { maxLength: 2 }),
      })
      .map(({ vms, pkg, knownPids, raw, threads, dram, guest }): StateSnapshot => {
        const s: StateSnapshot = {
          nextHostVmId: 51,
          vms: vms.map((v) => ({ ...v, baseline: v.baseline && v.live })),
          packages: [{ pkg: 0, ...pkg, energyUj: uj(pkg.energyJ), unattributedUj: uj(pkg.unattributedJ) }],
          knownPids,
          lastSample: { monotonicNs: nowNs, realtimeNs: BigInt(Date.now()) * 1_000_000n, packages: [{ pkg: 0, raw }], threads },
        };
        if (dram !== null && vms.length > 0)
          s.domains = {
            vms: [{ hostVmId: vms[0]!.hostVmId, domain: 'dram', energyJ: [dram] }],
            packages: [{ pkg: 0, domain: 'dram', energyJ: dram, unattributedJ: 0 }],
            counters: [{ pkg: 0, domain: 'dram', raw }],
          };
        if (guest.length > 0) s.guest = guest;
        return s;
      }),
  );
}

/** What a mutation writes over the payload: bytes, a whole field, or a value at an edge. */
const patch: fc.Arbitrary<Buffer> = fc.oneof(
  fc.uint8Array({ minLength: 1, maxLength: 4 }).map((a) => Buffer.from(a)),
  fc.integer({ min: 0, max: 0xffffffff }).map((v) => {
    const b = Buffer.alloc(4);
    b.writeUInt32LE(v);
    return b;
  }),
  fc.bigInt({ min: 0n, max: (1n << 64n) - 1n }).map((v) => {
    const b = Buffer.alloc(8);
    b.writeBigUInt64LE(v);
    return b;
  }),
  fc.constantFrom(1e303, Number.MAX_VALUE, Infinity, -Infinity, NaN, -0, -1, 2 ** 53, 1.8e13, 5e-324).map((v) => {
    const b = Buffer.alloc(8);
    b.writeDoubleLE(v);
    return b;
  }),
  fc.constantFrom(0, 1, 0xff, 0xffff, 0xffffffff, 0xfffffffe).map((v) => {
    const b = Buffer.alloc(4);
    b.writeUInt32LE(v);
    return b;
  }),
);

/** `bytes` with `patches` written over its payload (each at an offset modulo the payload), and its CRC made right. */
function mutate(bytes: Buffer, patches: { at: number; with: Buffer }[]): Buffer {
  const out = Buffer.from(bytes);
  const payload = out.subarray(STATE_HEADER_SIZE);
  for (const p of patches) {
    const at = p.at % payload.length;
    p.with.copy(payload, at, 0, Math.min(p.with.length, payload.length - at));
  }
  out.writeUInt32LE(zlib.crc32(payload), 16);
  return out;
}

describe('mutated restart states', () => {
  it('decodeState refuses finite joules whose microjoules are infinite, instead of throwing', () => {
    const s: StateSnapshot = { nextHostVmId: 1, vms: [], packages: [], knownPids: [], lastSample: null };
    const bytes = encodeState({ ...s, packages: [{ pkg: 0, energyJ: 1, unattributedJ: 0, energyUj: 1_000_000n, unattributedUj: 0n }] });
    // The package's energyJ (after u32 next id, u32 VM count, u32 package count, u32 pkg, u64 µJ, u64 µJ).
    bytes.writeDoubleLE(1e303, STATE_HEADER_SIZE + 4 + 4 + 4 + 4 + 8 + 8);
    const r = decodeState(mutate(bytes, []));
    expect(r).toMatchObject({ ok: false });
    expect(r.ok ? '' : r.error).toMatch(/^cannot restore state: package 0: its totals in J and µJ disagree;/);
  });

  it('every mutated state decodes or is refused by name, never throws, and every one decoded restores without an error', async () => {
    const nowNs = monotonicNs();
    const accepted: StateSnapshot[] = [];
    let refused = 0;
    fc.assert(
      fc.property(restorable(nowNs), fc.array(fc.record({ at: fc.nat(), with: patch }), { minLength: 1, maxLength: 3 }), (s, patches) => {
        const r = decodeState(mutate(encodeState(s), patches));
        if (!r.ok) {
          expect(r.error).toMatch(/^cannot restore state: /);
          // decodeState turns a check that throws into a refusal too: none may need to.
          expect(r.error).not.toContain('failed unexpectedly');
          refused++;
        } else if (accepted.length < RESTORED_MUTANTS) accepted.push(r.value);
      }),
      { numRuns: DECODED_MUTANTS },
    );
    // Both sides were exercised: mutants refused, and mutants accepted to restore.
    expect(refused).toBeGreaterThan(DECODED_MUTANTS / 10);
    expect(accepted.length).toBe(RESTORED_MUTANTS);

    let restored = 0;
    for (const s of accepted) {
      let chain: V2Chain | undefined;
      try {
        chain = await assembleV2({
          paths: fake.hostPaths(),
          device,
          vendor: 'intel',
          intervalMs: 60_000,
          limits: DEFAULT_V2_LIMITS,
          log,
          discovery: true,
          deferDiscovery: true,
          restore: s,
          restoreWaitMs: 60_000,
          // --guest-energy exact, its counters restored with the rest (no QEMU was answered meanwhile).
          guestEnergy: { maxThreads: 64, log, answer: () => new Map() },
        });
        // Restored, or refused by name as a whole (a check of this host's counters, clock or /proc): the service starts fresh.
        const why = chain.service.restored;
        if (why === null) throw new Error('the service was given a state and says it was not');
        if (!why.ok) expect(why.error).toMatch(/^cannot restore state: /);
        else restored++;
        // Whatever it restored, the next restart saves and reads again.
        const again = decodeState(encodeState(chain.service.snapshot()));
        expect(again.ok ? 'decoded' : again.error).toBe('decoded');
      } finally {
        await chain?.close();
      }
    }
    expect(restored).toBeGreaterThan(0);
  }, 300_000);
});
