/**
 * A VM's statistics written straight into a guest's copy (StatsFiles.copy, docs/guest.md) by the
 * daemon's own writer, against the real ratio engine and a real memfd: no memfd until a STATS_FD asks,
 * which then holds the copy's values; an idle interval moves the times and power alone and leaves the
 * values right; a vCPU list that changes shape while the VM is idle still marks the copy replaced.
 */
import fs from 'node:fs';
import pino from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { RatioEngine } from '../../src/ratio/attribution.js';
import { StatsFiles } from '../../src/helper/v2/stats-files.js';
import type { VmRegistry } from '../../src/helper/v2/vm-registry.js';
import { StatsReader } from '../../src/client/stats-reader.js';
import { decodeStatsLayout } from '../../src/protocol/stats/layout.js';
import { decodeStatsValues } from '../support/stats-values.js';
import { host, sample, units } from '../ratio/helpers.js';

const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanups.splice(0).reverse()) c();
});

/** A real engine with one VM of two vCPUs, and the daemon's statistics files over it. */
function setup() {
  const engine = new RatioEngine(host([2]));
  const pid = 10;
  const vm = engine.register({
    pid,
    starttime: 1000,
    vcpus: [
      { tid: 11, vpkg: 0 },
      { tid: 12, vpkg: 0 },
    ],
  });
  const registry = { get: (id: number) => (id === vm ? { pid, name: 'vm-a' } : undefined) } as unknown as Pick<VmRegistry, 'get'>;
  const files = new StatsFiles({
    registry,
    sampling: { engine, running: true },
    intervalNs: 1_000_000_000n,
    clkTck: 100,
    hostValues: () => ({ tNs: 0n, packages: [], unattributedUj: 0n, stats: {} }) as never,
    log: pino({ level: 'silent' }),
    clock: () => 0n,
  });
  cleanups.push(() => files.close());
  /** One sample at `s` seconds: the vCPUs' ticks `ticks` (unchanged: an idle interval), 100 J a second. */
  const at = (s: number, ticks: number) => {
    const tasks = {
      [pid]: [
        { tid: pid, ticks: 0 },
        { tid: 11, ticks },
        { tid: 12, ticks: ticks / 2 },
      ],
    };
    const result = engine.addSample(sample(s, { 0: units(100 * s) }, tasks));
    files.sample({ tNs: BigInt(s * 1e9), result, ended: [] });
  };
  return { engine, vm, files, at };
}

/** A guest's copy in plain memory, and its values decoded (every name but the generation). */
function guestCopy(files: StatsFiles, vm: number) {
  let memory: ArrayBuffer | null = null;
  const copy = files.copy(vm, (bytes) => {
    memory = new ArrayBuffer(bytes.length);
    new Uint8Array(memory).set(bytes);
    return memory;
  })!;
  const bytes = () => Buffer.from(memory!);
  const layout = decodeStatsLayout(bytes(), bytes().length);
  if (!layout.ok) throw new Error(layout.error);
  const values = () => {
    const all = decodeStatsValues(layout.value, bytes().subarray(layout.value.dataOffset));
    all.delete('generation');
    return all;
  };
  return { copy, values, bytes };
}

/** The memfds of VM `vm`'s statistics file this process holds. */
const memfdsOf = (vm: number) =>
  fs.readdirSync('/proc/self/fd').filter((fd) => {
    try {
      return fs.readlinkSync(`/proc/self/fd/${fd}`).startsWith(`/memfd:vmsr-vm-${vm} `);
    } catch {
      return false;
    }
  }).length;

describe('StatsFiles.copy', () => {
  it("makes no memfd for a copy; a STATS_FD asked later gets the copy's bytes and values, and both follow every sample", () => {
    const { vm, files, at } = setup();
    at(0, 0);
    at(1, 50);
    const g = guestCopy(files, vm);
    expect(memfdsOf(vm)).toBe(0);
    at(2, 120);
    expect(g.values().get('energy')![0]).toBeGreaterThan(0n);
    const made = files.vm(vm);
    if (!made.ok) throw new Error(made.error.message);
    expect(memfdsOf(vm)).toBe(1);
    const r = StatsReader.open(made.value.openReadOnly());
    cleanups.push(() => r.close());
    const fromFd = () => {
      const s = r.read();
      return new Map(r.layout.descriptors.filter((d) => d.name !== 'generation').map((d) => [d.name, r.values(s, d.name)!]));
    };
    // The same header, id string and descriptors.
    const head = Buffer.alloc(r.layout.dataOffset);
    fs.readSync(r.fd, head, 0, head.length, 0);
    expect(head.equals(g.bytes().subarray(0, r.layout.dataOffset))).toBe(true);
    expect(fromFd()).toEqual(g.values());
    for (const [s, ticks] of [
      [3, 200],
      [4, 200],
      [5, 260],
    ] as const) {
      at(s, ticks);
      expect(fromFd()).toEqual(g.values());
      expect(g.values().get('sample_monotonic')).toEqual([BigInt(s * 1e9)]);
    }
  });

  it('moves only the times and power in an idle interval, the values staying those of the last change', () => {
    const { engine, vm, files, at } = setup();
    at(0, 0);
    at(1, 100);
    const g = guestCopy(files, vm);
    at(2, 200);
    const busy = g.values();
    expect(busy.get('power')![0]).toBeGreaterThan(0n);
    // The guest's zones are passed over while no value was written (guest-stats-file.ts valuesMoved).
    const written = g.copy.valuesWritten;
    at(3, 200);
    expect(g.copy.valuesWritten).toBe(written);
    const idle = g.values();
    expect(idle.get('sample_monotonic')).toEqual([3_000_000_000n]);
    expect(idle.get('next_sample_monotonic')).toEqual([4_000_000_000n]);
    expect(idle.get('power')).toEqual([0n]);
    for (const name of ['energy', 'msr_energy_status', 'vcpu_tid', 'vcpu_energy', 'vcpu_cpu_time', 'other_threads_cpu_time'])
      expect(idle.get(name), name).toEqual(busy.get(name));
    const out = engine.output(vm)!;
    expect(idle.get('energy')).toEqual([out.vpkgs[0]!.energyUj]);
    at(4, 300);
    expect(g.copy.valuesWritten).toBe(written + 1);
    expect(g.values().get('energy')![0]).toBeGreaterThan(idle.get('energy')![0]!);
  });

  it('marks the copy replaced at the next sample when the vCPU list changes shape while the VM is idle, and makes a new one on asking', () => {
    const { engine, vm, files, at } = setup();
    at(0, 0);
    at(1, 100);
    const g = guestCopy(files, vm);
    at(2, 100);
    engine.updateVcpus(vm, [{ tid: 11, vpkg: 0 }]);
    at(3, 100);
    expect(g.copy.current).toBe(false);
    expect(g.values().get('replaced')).toEqual([1n]);
    expect(g.values().get('next_sample_monotonic')).toEqual([0n]);
    const again = guestCopy(files, vm);
    expect(again.values().get('vcpu_tid')).toEqual([11n]);
    expect(again.copy.current).toBe(true);
  });
});
