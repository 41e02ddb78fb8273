/**
 * The power limits' section of the state snapshot (version 4 on; docs/power-limits.md "Restarts and crashes"):
 *
 *   u32 count, each: u32 vmId | u32 pid | f64 limitW | f64 limitedS | f64 quotaCpus (0: none)
 *     | u8 flags (1 fromFile) | u8 domain (ENERGY_DOMAINS index; 0, the package, in the layout before
 *     domains, where the byte was 0) | u16 group count, each:
 *       u8 made | u8 saved bytes | u8 written bytes (255: none) | u8 0 | u16 dir bytes | dir | saved | written
 */
import { STATE_LIMITS, type HeldGroupState, type PowerLimitState } from './snapshot.js';
import { firstTime, Refused, type Reader, type Writer } from './byte-io.js';
import { ENERGY_DOMAINS } from '../model/domains.js';

/** A quota file's bytes (a cgroup's is a few), and a group's path. */
const MAX_QUOTA_BYTES = 64;
const MAX_DIR_BYTES = 4096;
const MAX_GROUPS = 1024;
const NONE = 255;

export function writePowerLimits(w: Writer, list: readonly PowerLimitState[]): void {
  w.list(4, list, (l) => {
    w.u32(l.vmId).u32(l.pid).f64(l.limitW).f64(l.limitedS);
    w.f64(l.quotaCpus ?? 0).u8(l.fromFile ? 1 : 0);
    w.u8(ENERGY_DOMAINS.indexOf(l.domain));
    w.list(2, l.groups, (g) => {
      const [dir, saved, written] = [Buffer.from(g.dir, 'utf8'), Buffer.from(g.saved, 'latin1'), g.written ?? ''];
      w.u8(g.made ? 1 : 0).u8(saved.length);
      w.u8(g.written === null ? NONE : written.length).u8(0);
      w.u16(dir.length).bytes(dir).bytes(saved);
      w.bytes(Buffer.from(written, 'latin1'));
    });
  });
}

export function readPowerLimits(r: Reader): PowerLimitState[] {
  const at = 'power limits';
  const group = (): HeldGroupState => {
    const [made, savedLen, writtenLen] = [r.u8(at), r.u8(at), r.u8(at)];
    r.u8(at);
    const dir = r.bytes(r.u16(at), at).toString('utf8');
    const saved = r.bytes(savedLen, at).toString('latin1');
    const written = writtenLen === NONE ? null : r.bytes(writtenLen, at).toString('latin1');
    return { dir, saved, written, made: made === 1 };
  };
  // Checked with the whole snapshot (stateProblem).
  return r.list(4, STATE_LIMITS.maxPowerLimits, 36, at, (): PowerLimitState => {
    const [vmId, pid, limitW, limitedS, quota, flags] = [r.u32(at), r.u32(at), r.f64(at), r.f64(at), r.f64(at), r.u8(at)];
    const domain = ENERGY_DOMAINS[r.u8(at)];
    if (domain === undefined) throw new Refused(`${at}: a limit's domain code is not one of ${ENERGY_DOMAINS.length}`);
    const groups = r.list(2, MAX_GROUPS, 6, at, group);
    return { vmId, pid, domain, limitW, limitedS, quotaCpus: quota === 0 ? null : quota, fromFile: flags === 1, groups };
  });
}

const quotaText = (s: string) => s.length <= MAX_QUOTA_BYTES && /^[ -~\n]*$/.test(s);

/** Why the power limits break a rule, or null. */
export function powerLimitsProblem(list: readonly PowerLimitState[]): string | null {
  if (list.length > STATE_LIMITS.maxPowerLimits) return `${list.length} power limits, at most ${STATE_LIMITS.maxPowerLimits}`;
  const once = firstTime();
  for (const l of list) {
    const at = `the ${l.domain} power limit of VM ${l.vmId}`;
    if (!once(`${l.vmId} ${l.domain}`)) return `${at} appears twice`;
    if (!(l.limitW > 0 && Number.isFinite(l.limitW)) || !(l.limitedS >= 0 && Number.isFinite(l.limitedS)))
      return `${at}: its limit or time limited is not a finite number above 0`;
    if (l.quotaCpus !== null && !(l.quotaCpus > 0 && Number.isFinite(l.quotaCpus)))
      return `${at}: its quota is not a finite number above 0`;
    if (l.groups.length > MAX_GROUPS) return `${at}: ${l.groups.length} groups, at most ${MAX_GROUPS}`;
    for (const g of l.groups) {
      if (Buffer.byteLength(g.dir) > MAX_DIR_BYTES || !g.dir.startsWith('/'))
        return `${at}: a group's path is not absolute or over ${MAX_DIR_BYTES} bytes`;
      if (!quotaText(g.saved) || (g.written !== null && !quotaText(g.written)))
        return `${at}: a quota file's bytes are not printable or over ${MAX_QUOTA_BYTES}`;
    }
  }
  return null;
}
