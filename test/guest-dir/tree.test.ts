/**
 * The guest tree's layout against the kernel's powercap class (Documentation/power/powercap/powercap.rst,
 * intel_rapl_common.c): zone names, files, units (µJ) and the wrap at max_energy_range_uj, and the
 * directory name of a VM (its UUID, else a name that is one plain path component).
 */
import { describe, expect, it } from 'vitest';
import { scanPowercap } from '../../src/energy/powercap-zones.js';
import {
  classLinkTarget,
  energyText,
  GUEST_ENERGY_RANGE,
  GUEST_MAX_ENERGY_RANGE_UJ,
  guestDirName,
  guestZoneShapes,
  zoneAttributes,
} from '../../src/guest-dir/tree.js';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

/** A VM of two virtual packages whose host reads core, DRAM and PSYS besides the package, and the energy of each domain per vpkg (µJ). */
const energy: Record<string, bigint[]> = {
  package: [5_000_000n, 7_000_000n],
  core: [2_000_000n, 3_000_000n],
  dram: [1_000_000n, 1_500_000n],
  psys: [4_000_000n, 6_000_000n],
};
const zones = guestZoneShapes(2, ['core', 'dram', 'psys']).map((z) => ({
  id: z.id,
  name: z.name,
  energyUj: z.vpkgs.reduce((sum, g) => sum + energy[z.domain]![g]!, 0n),
}));

describe('guest tree', () => {
  it('names zones as the kernel does: a package zone per vpkg, its sub-zones in core, uncore, dram order, psys after the packages', () => {
    expect(zones.map((z) => [z.id, z.name, z.energyUj])).toEqual([
      ['intel-rapl:0', 'package-0', 5_000_000n],
      ['intel-rapl:0:0', 'core', 2_000_000n],
      ['intel-rapl:0:1', 'dram', 1_000_000n],
      ['intel-rapl:1', 'package-1', 7_000_000n],
      ['intel-rapl:1:0', 'core', 3_000_000n],
      ['intel-rapl:1:1', 'dram', 1_500_000n],
      ['intel-rapl:2', 'psys', 10_000_000n],
    ]);
    expect(guestZoneShapes(2, []).map((z) => z.id)).toEqual(['intel-rapl:0', 'intel-rapl:1']);
  });

  it("reads back through the helper's own powercap scanner as the kernel's tree does (names, files, µJ, range)", () => {
    const sys = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-guest-tree-'));
    try {
      const cls = path.join(sys, 'class/powercap');
      fs.mkdirSync(cls, { recursive: true });
      for (const z of zones) {
        const d = path.join(sys, z.id);
        fs.mkdirSync(d);
        for (const a of zoneAttributes(z)) fs.writeFileSync(path.join(d, a.file), a.text);
        fs.writeFileSync(path.join(d, 'energy_uj'), energyText(z.energyUj));
        fs.symlinkSync(classLinkTarget(z.id), path.join(cls, z.id));
      }
      const scan = scanPowercap(sys, 'intel');
      expect(scan.skipped).toEqual([]);
      expect(scan.zones.map((z) => [z.id, z.domain, z.pkg, z.maxEnergyRangeUj])).toEqual([
        ['intel-rapl:0', 'package', 0, GUEST_MAX_ENERGY_RANGE_UJ],
        ['intel-rapl:0:0', 'core', 0, GUEST_MAX_ENERGY_RANGE_UJ],
        ['intel-rapl:0:1', 'dram', 0, GUEST_MAX_ENERGY_RANGE_UJ],
        ['intel-rapl:1', 'package', 1, GUEST_MAX_ENERGY_RANGE_UJ],
        ['intel-rapl:1:0', 'core', 1, GUEST_MAX_ENERGY_RANGE_UJ],
        ['intel-rapl:1:1', 'dram', 1, GUEST_MAX_ENERGY_RANGE_UJ],
        ['intel-rapl:2', 'psys', undefined, GUEST_MAX_ENERGY_RANGE_UJ],
      ]);
      expect(fs.readFileSync(path.join(cls, 'intel-rapl:1:1/energy_uj'), 'utf8')).toBe('1500000\n');
    } finally {
      fs.rmSync(sys, { recursive: true, force: true });
    }
  });

  it('wraps energy_uj to 0 after max_energy_range_uj, as sysfs does (the range is max + 1)', () => {
    expect(GUEST_ENERGY_RANGE).toBe(GUEST_MAX_ENERGY_RANGE_UJ + 1n);
    expect(energyText(GUEST_MAX_ENERGY_RANGE_UJ)).toBe(`${GUEST_MAX_ENERGY_RANGE_UJ}\n`);
    expect(energyText(GUEST_MAX_ENERGY_RANGE_UJ + 1n)).toBe('0\n');
    expect(energyText(GUEST_MAX_ENERGY_RANGE_UJ + 10n)).toBe('9\n');
    expect(energyText(0n)).toBe('0\n');
  });

  it('names a directory by the UUID, else by a name that is one plain path component', () => {
    const uuid = Buffer.from('11111111222233334444555566667777', 'hex');
    expect(guestDirName(uuid, 'web')).toBe('11111111-2222-3333-4444-555566667777');
    expect(guestDirName(null, 'web-1')).toBe('web-1');
    for (const bad of ['', '.', '..', '../etc', 'a/b', '.hidden', 'a\nb', 'x'.repeat(256)]) expect(guestDirName(null, bad)).toBeNull();
    expect(guestDirName(null, null)).toBeNull();
  });
});
