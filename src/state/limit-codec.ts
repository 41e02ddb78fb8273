/** The power limits' section of the state snapshot (version 4 on; docs/power-limits.md "Restarts and crashes"). */
import { STATE_LIMITS, type HeldGroupState, type PowerLimitState } from './snapshot.js';
import { firstTime, Refused, type Io } from './byte-io.js';
import { ENERGY_DOMAINS } from '../model/domains.js';

/** A quota file's bytes (a cgroup's is a few), and a group's path. */
const MAX_QUOTA_BYTES = 64;
const MAX_DIR_BYTES = 4096;
const MAX_GROUPS = 1024;
const NONE = 255;

/** Checked with the whole snapshot (stateProblem). */
export function powerLimitsIo(io: Io, list?: readonly PowerLimitState[]): PowerLimitState[] {
  const at = 'power limits';
  const group = (g?: HeldGroupState): HeldGroupState => {
    const [dirIn, savedIn] = [g && Buffer.from(g.dir, 'utf8'), g && Buffer.from(g.saved, 'latin1')];
    const writtenIn = g?.written == null ? undefined : Buffer.from(g.written, 'latin1');
    const [made, savedLength] = [io.u8(g && (g.made ? 1 : 0), at), io.u8(savedIn?.length, at)];
    const writtenLength = io.u8(g && (writtenIn?.length ?? NONE), at);
    io.u8(g && 0, at); // not checked when read
    const dir = io.bytes(dirIn, io.u16(dirIn?.length, at), at).toString('utf8');
    const saved = io.bytes(savedIn, savedLength, at).toString('latin1');
    const written = writtenLength === NONE ? null : io.bytes(writtenIn, writtenLength, at).toString('latin1');
    return g ?? { dir, saved, written, made: made === 1 };
  };
  return io.list(4, list, STATE_LIMITS.maxPowerLimits, 36, at, (l) => {
    const [vmId, pid, limitW, limitedS] = [io.u32(l?.vmId, at), io.u32(l?.pid, at), io.f64(l?.limitW, at), io.f64(l?.limitedS, at)];
    const [quota, flags] = [io.f64(l && (l.quotaCpus ?? 0), at), io.u8(l && (l.fromFile ? 1 : 0), at)];
    // 0, the package, in the layout before domains, where the byte was 0.
    const domain = ENERGY_DOMAINS[io.u8(l && ENERGY_DOMAINS.indexOf(l.domain), at)];
    if (domain === undefined) throw new Refused(`${at}: a limit's domain code is not one of ${ENERGY_DOMAINS.length}`);
    const groups = io.list(2, l?.groups, MAX_GROUPS, 6, at, group);
    return l ?? { vmId, pid, domain, limitW, limitedS, quotaCpus: quota === 0 ? null : quota, fromFile: flags === 1, groups };
  });
}

const quotaText = (s: string) => s.length <= MAX_QUOTA_BYTES && /^[ -~\n]*$/.test(s);

/** Why the power limits break a rule, or null. */
export function powerLimitsProblem(list: readonly PowerLimitState[]): string | null {
  const once = firstTime();
  for (const l of list) {
    const at = `the ${l.domain} power limit of VM ${l.vmId}`;
    if (!once(`${l.vmId} ${l.domain}`)) return `${at} appears twice`;
    if (!(l.limitW > 0 && Number.isFinite(l.limitW)) || !(l.limitedS >= 0 && Number.isFinite(l.limitedS)))
      return `${at}: its limit or time limited is not a finite number above 0`;
    if (l.quotaCpus !== null && !(l.quotaCpus > 0 && Number.isFinite(l.quotaCpus)))
      return `${at}: its quota is not a finite number above 0`;
    for (const g of l.groups) {
      if (Buffer.byteLength(g.dir) > MAX_DIR_BYTES || !g.dir.startsWith('/'))
        return `${at}: a group's path is not absolute or over ${MAX_DIR_BYTES} bytes`;
      if (!quotaText(g.saved) || (g.written !== null && !quotaText(g.written)))
        return `${at}: a quota file's bytes are not printable or over ${MAX_QUOTA_BYTES}`;
    }
  }
  return null;
}
