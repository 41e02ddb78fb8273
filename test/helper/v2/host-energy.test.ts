/** HostEnergy: per-package totals for HOST_UPDATE, plain numbers in and out, no sockets. */
import { describe, expect, it } from 'vitest';
import { daemonCounters, HostEnergy } from '../../../src/helper/v2/host-energy.js';
import type { DaemonCounters } from '../../../src/protocol/v2/codec.js';

const stats: DaemonCounters = daemonCounters(
  undefined,
  { samples: 3, failures: 1, lastLatenessNs: 0n, skippedTicks: 0, lastDurationNs: 42n },
  2,
  5,
);

describe('HostEnergy', () => {
  it('lists every host package at zero before the first sample, with time 0', () => {
    const v = new HostEnergy([0, 1]).values(false, true, stats);
    expect(v.tNs).toBe(0n);
    expect(v.packages).toEqual([
      { pkg: 0, energyUj: 0n, unattributedUj: 0n },
      { pkg: 1, energyUj: 0n, unattributedUj: 0n },
    ]);
    expect(v.unattributedUj).toBe(0n);
  });

  it('adds each sample to its packages: energy, and the part attributed to no VM, summed over packages', () => {
    const h = new HostEnergy([0, 1]);
    h.add(10n, [
      { pkg: 0, energyJ: 2, attributedJ: 0.5 },
      { pkg: 1, energyJ: 1, attributedJ: 1 },
    ]);
    h.add(20n, [{ pkg: 0, energyJ: 3, attributedJ: 1 }]);
    const v = h.values(true, true, stats);
    expect(v.tNs).toBe(20n);
    expect(v.packages).toEqual([
      { pkg: 0, energyUj: 5_000_000n, unattributedUj: 3_500_000n },
      { pkg: 1, energyUj: 1_000_000n, unattributedUj: 0n },
    ]);
    expect(v.unattributedUj).toBe(3_500_000n);
    expect(v.vmsChanged).toBe(true);
    expect(v.stats).toBe(stats);
  });

  it('never lets the unattributed energy go back when VMs were given more than the package by rounding', () => {
    const h = new HostEnergy([0]);
    h.add(1n, [{ pkg: 0, energyJ: 1, attributedJ: 0.25 }]);
    h.add(2n, [{ pkg: 0, energyJ: 1, attributedJ: 1.000001 }]);
    expect(h.values(false, true, stats).packages[0]!.unattributedUj).toBe(750_000n);
  });

  it('leaves per-package unattributed energy out of the layout that did not ask for it', () => {
    const h = new HostEnergy([0]);
    h.add(1n, [{ pkg: 0, energyJ: 1, attributedJ: 0 }]);
    const v = h.values(false, false, stats);
    expect(v.packages).toEqual([{ pkg: 0, energyUj: 1_000_000n, unattributedUj: null }]);
    expect(v.unattributedUj).toBe(1_000_000n);
  });

  it('gives the other domains per package in µJ only to the layout that asked, empty on a host that reads only the package', () => {
    const h = new HostEnergy([0, 1], undefined, [
      { pkg: 0, domain: 'dram' },
      { pkg: 1, domain: 'dram' },
      { pkg: 0, domain: 'psys' },
    ]);
    h.add(1n, [
      {
        pkg: 0,
        energyJ: 4,
        attributedJ: 1,
        domains: [
          { domain: 'dram', energyJ: 0.5, attributedJ: 0.125 },
          { domain: 'psys', energyJ: 9, attributedJ: 3 },
        ],
      },
      { pkg: 1, energyJ: 2, attributedJ: 0, domains: [{ domain: 'dram', energyJ: 0.25, attributedJ: 0.3 }] },
    ]);
    expect(h.values(false, false, stats).domains).toBeUndefined();
    expect(h.values(false, true, stats, true).domains).toEqual([
      { pkg: 0, domain: 'dram', energyUj: 500_000n, unattributedUj: 375_000n },
      { pkg: 1, domain: 'dram', energyUj: 250_000n, unattributedUj: 0n },
      { pkg: 0, domain: 'psys', energyUj: 9_000_000n, unattributedUj: 6_000_000n },
    ]);
    expect(new HostEnergy([0]).values(false, true, stats, true).domains).toEqual([]);
  });

  it('moves its time on with a sample that has no energy (the baseline)', () => {
    const h = new HostEnergy([0]);
    h.add(7n, []);
    expect(h.values(false, true, stats).tNs).toBe(7n);
  });

  it('gives its state as plain data, and one made from that state goes on from there', () => {
    const h = new HostEnergy([0, 1]);
    h.add(10n, [{ pkg: 1, energyJ: 2, attributedJ: 1 }]);
    const state = h.state();
    expect(state).toEqual({
      tNs: 10n,
      packages: [
        { pkg: 0, energyJ: 0, unattributedJ: 0 },
        { pkg: 1, energyJ: 2, unattributedJ: 1 },
      ],
    });
    const again = new HostEnergy([0, 1], structuredClone(state));
    again.add(20n, [{ pkg: 1, energyJ: 1, attributedJ: 0 }]);
    h.add(20n, [{ pkg: 1, energyJ: 1, attributedJ: 0 }]);
    expect(again.values(false, true, stats)).toEqual(h.values(false, true, stats));
  });
});

describe('daemonCounters', () => {
  it('counts the v2 connections and no legacy requests without a health source, the daemon-wide ones with it', () => {
    expect(stats).toEqual({
      legacyOk: 0n,
      legacyRefused: 0n,
      legacyFailed: 0n,
      lastSampleDurationNs: 42n,
      samples: 3n,
      sampleFailures: 1n,
      connections: 2,
      vms: 5,
    });
    const health = { legacy: { ok: 7, refused: 2, failed: 1 }, connections: () => 11 };
    expect(
      daemonCounters(health, { samples: 0, failures: 0, lastLatenessNs: 0n, skippedTicks: 0, lastDurationNs: 0n }, 2, 0),
    ).toMatchObject({
      legacyOk: 7n,
      legacyRefused: 2n,
      legacyFailed: 1n,
      connections: 11,
    });
  });
});
