/** A VM's guest directory (docs/guest.md), pure: a tree shaped like the kernel's powercap class, so tools reading it read it unchanged. */
import { formatUuid } from '../common/uuid.js';
import { MAX_ENERGY_RANGE_UJ, POWERCAP_CLASS_DIR, ZONE_ID } from '../energy/powercap-zones.js';

/** Every zone's max_energy_range_uj: the kernel's for a 32-bit RAPL counter in 2^-14 J (docs/guest.md). */
export const GUEST_MAX_ENERGY_RANGE_UJ = 262_143_328_850n;
/** energy_uj takes max_energy_range_uj itself before it wraps to 0. */
export const GUEST_ENERGY_RANGE = GUEST_MAX_ENERGY_RANGE_UJ + 1n;
export const GUEST_STATS_FILE = 'stats';
/** The top of class/powercap, where node_exporter (procfs's GetRaplZones) lists the zones. */
const CLASS_DIR = POWERCAP_CLASS_DIR.split('/')[0]!;

/** The package sub-zone domains, numbered in the kernel's order among those present. */
const SUB_ZONES = ['core', 'uncore', 'dram'] as const;

/** A zone of the tree as laid out: its directory, its `name`, and the VM's energy it sums (a domain's, over some virtual packages). */
export interface ZoneShape {
  id: string;
  name: string;
  domain: string;
  vpkgs: number[];
}

/** The zones of a VM of `nvpkg` virtual packages whose host reads `domains` besides the package (psys summed over them all). */
export function guestZoneShapes(nvpkg: number, domains: readonly string[]): ZoneShape[] {
  const zones: ZoneShape[] = [];
  const subs = SUB_ZONES.filter((d) => domains.includes(d));
  for (let g = 0; g < nvpkg; g++) {
    zones.push({ id: `intel-rapl:${g}`, name: `package-${g}`, domain: 'package', vpkgs: [g] });
    subs.forEach((d, i) => zones.push({ id: `intel-rapl:${g}:${i}`, name: d, domain: d, vpkgs: [g] }));
  }
  if (domains.includes('psys')) zones.push({ id: `intel-rapl:${nvpkg}`, name: 'psys', domain: 'psys', vpkgs: [...Array(nvpkg).keys()] });
  return zones;
}

/** energy_uj's text for a count of µJ: wrapped into the range, as sysfs shows it. */
export function energyText(uj: bigint): string {
  return `${uj % GUEST_ENERGY_RANGE}\n`;
}

/** A zone's fixed attributes, written once when it is made: name and max_energy_range_uj. */
export function zoneAttributes(z: { name: string }): { file: string; text: string }[] {
  return [
    { file: 'name', text: `${z.name}\n` },
    { file: MAX_ENERGY_RANGE_UJ, text: `${GUEST_MAX_ENERGY_RANGE_UJ}\n` },
  ];
}

/** The symlink class/powercap/<id> holds: the zone two levels up, inside the tree. */
export function classLinkTarget(id: string): string {
  return `../../${id}`;
}

/** Names the helper makes at the top of a guest directory (its temporary files start with '.vmsr-'). */
export function isHelperEntry(name: string): boolean {
  return ZONE_ID.test(name) || name === CLASS_DIR || name === GUEST_STATS_FILE || name.startsWith(TEMP_PREFIX);
}

export const TEMP_PREFIX = '.vmsr-';

/** A VM's directory name under --guest-dir: its UUID, else its name when that is one plain, visible path component; or null. */
export function guestDirName(uuid: Uint8Array | null, name: string | null): string | null {
  if (uuid !== null && uuid.length === 16) return formatUuid(uuid);
  if (name === null || name === '' || name.startsWith('.') || name.includes('/')) return null;
  if (/[\x00-\x1f\x7f]/.test(name) || Buffer.byteLength(name) > 255 /* NAME_MAX */) return null;
  return name;
}
