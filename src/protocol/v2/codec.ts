/** v2 framing (docs/protocol.md "v2"), `u16 type, u16 flags, u32 length, payload` little-endian, and each frame's encoder. Pure. */
import type { VcpuSpec } from '../../model/vcpus.js';
import { ENERGY_DOMAINS, type EnergyDomain, type OtherDomain } from '../../model/domains.js';

export const HEADER_SIZE = 8;
export const MAX_PAYLOAD = 65536;

export const T = {
  REGISTER: 0x01,
  READ: 0x02,
  SUBSCRIBE: 0x03,
  UNREGISTER: 0x04,
  // Observers: docs/protocol-v2.md "Observers".
  LIST: 0x05,
  OBSERVE: 0x06,
  UNOBSERVE: 0x07,
  HOST_SUBSCRIBE: 0x08,
  // The reply carries one fd (SCM_RIGHTS): docs/stats-fd.md.
  STATS_FD: 0x09,
  // docs/power-limits.md.
  LIMIT: 0x0a,
  REGISTERED: 0x81,
  VALUE: 0x82,
  UPDATE: 0x83,
  OK: 0x84,
  VM_LIST: 0x85,
  HOST_UPDATE: 0x86,
  STATS_FD_REPLY: 0x87,
  LIMIT_STATE: 0x88,
  ERROR: 0xff,
} as const;

/** What a client sends (each request's type is below 0x80) and what the helper sends (each reply's above). */
export const CLIENT_TYPES: ReadonlySet<number> = new Set(Object.values(T).filter((t) => t < 0x80));
export const HELPER_TYPES: ReadonlySet<number> = new Set(Object.values(T).filter((t) => t > 0x80));

export const E = {
  MALFORMED: 1,
  NOT_PERMITTED: 2,
  NO_SUCH: 3,
  LIMIT: 4,
  ENERGY_SOURCE: 5,
  PROCESS_GONE: 6,
  /** The helper restarts (docs/daemon.md "Restarts"): sent once, request type 0, then the connection closes; reconnect. */
  RESTARTING: 7,
} as const;

/** Bit 0 of flags on VALUE and UPDATE: the VM has ended, values are final. */
export const FLAG_ENDED = 0x1;

// A flag that changes a reply's layout is sent only to a connection that asked: a client that never asks keeps the first layout.

/** Bit 0 of flags on HOST_UPDATE: a VM appeared, ended or was dropped since the previous sample (LIST again). */
export const FLAG_VMS_CHANGED = 0x1;
/** Bit 1 of flags on HOST_UPDATE: package entries of HOST_PKG_SIZE_PER_PACKAGE bytes, with their unattributed energy. */
export const FLAG_PER_PACKAGE = 0x2;
/** Bit 0 of flags on HOST_SUBSCRIBE: send HOST_UPDATEs with FLAG_PER_PACKAGE. */
export const HOST_SUBSCRIBE_PER_PACKAGE = 0x1;

/** Bit 1 of flags on UPDATE: the domain block (the VM's energy of each other RAPL domain, per vpkg) follows. */
export const FLAG_DOMAINS = 0x2;
/** Bit 0 of flags on SUBSCRIBE and OBSERVE: send this VM's UPDATEs with FLAG_DOMAINS. */
export const WATCH_DOMAINS = 0x1;
/** Bit 2 of flags on HOST_UPDATE: the domain block (per package and other domain: energy, unattributed) follows. */
export const FLAG_HOST_DOMAINS = 0x4;
/** Bit 1 of flags on HOST_SUBSCRIBE: send HOST_UPDATEs with FLAG_HOST_DOMAINS. */
export const HOST_SUBSCRIBE_DOMAINS = 0x2;
/** Bit 0 of flags on LIMIT: set the limit to its milliwatts (0 = remove it); clear: only read it. */
export const LIMIT_SET = 0x1;
/** Bit 1 of flags on LIMIT: the payload carries a u32 domain code after the milliwatts (absent: the package). */
export const LIMIT_DOMAIN = 0x2;
/** LIMIT_STATE's payload: u32 vm_id, u32 limit_mw, u32 quota_us, u32 period_us, u64 limited_ns. */
export const LIMIT_STATE_SIZE = 24;
/** Bit 0 of flags on LIMIT_STATE (the reply to a LIMIT with LIMIT_DOMAIN): u32 domain code, u32 reserved follow. */
export const LIMIT_STATE_DOMAIN = 0x1;

/** The domain block's header (u32 count, u32 reserved), on UPDATE and HOST_UPDATE. */
export const DOMAIN_BLOCK_HEADER = 8;
/** An UPDATE domain entry without its values: u32 domain code, u32 reserved; then nvpkg x u64 energy_uj. */
export const VM_DOMAIN_FIXED = 8;
export const HOST_DOMAIN_SIZE = 24;

/** The wire code of a RAPL domain: its index in ENERGY_DOMAINS (0, the package, never appears in a domain block). */
export function domainCode(d: OtherDomain): number {
  return ENERGY_DOMAINS.indexOf(d);
}

/** The domain a domain block's code names, or null for a code that names no other domain (0, or unknown). */
export function domainOfCode(code: number): OtherDomain | null {
  const d = code > 0 ? ENERGY_DOMAINS[code] : undefined;
  return d === undefined || d === 'package' ? null : d;
}

/** Bit 3 of a VM_LIST entry's flags: the 16 bytes of its uuid are set. */
export const VM_HAS_UUID = 0x8;

/** Bytes a VM name may take in a VM_LIST entry (UTF-8, cut at a character boundary). */
export const MAX_NAME_BYTES = 255;
/** VM_LIST entry size without its name. */
export const VM_ENTRY_FIXED = 44;
/** VM_LIST payload header: count, next_id. */
export const VM_LIST_HEADER = 8;
/** HOST_UPDATE payload size without its package entries. */
export const HOST_UPDATE_FIXED = 80;
export const HOST_PKG_SIZE = 16;
export const HOST_PKG_SIZE_PER_PACKAGE = 24;

const ERROR_NAMES: Readonly<Record<number, string>> = {
  [E.MALFORMED]: 'malformed request',
  [E.NOT_PERMITTED]: 'not permitted',
  [E.NO_SUCH]: 'no such VM or virtual package',
  [E.LIMIT]: 'limit reached',
  [E.ENERGY_SOURCE]: 'energy source failed',
  [E.PROCESS_GONE]: 'process gone',
  [E.RESTARTING]: 'helper restarting',
};

export function errorCodeName(code: number): string {
  return ERROR_NAMES[code] ?? `unknown error code ${code}`;
}

export function typeName(type: number): string {
  const entry = Object.entries(T).find(([, v]) => v === type);
  return entry ? entry[0] : `0x${type.toString(16).padStart(2, '0')}`;
}

export function encodeFrame(type: number, flags: number, payload: Buffer): Buffer {
  if (payload.length > MAX_PAYLOAD) throw new RangeError(`payload of ${payload.length} bytes is over ${MAX_PAYLOAD}`);
  const out = Buffer.alloc(HEADER_SIZE + payload.length);
  out.writeUInt16LE(type, 0);
  out.writeUInt16LE(flags, 2);
  out.writeUInt32LE(payload.length, 4);
  payload.copy(out, HEADER_SIZE);
  return out;
}

function u32Payload(...values: number[]): Buffer {
  const p = Buffer.alloc(4 * values.length);
  values.forEach((v, i) => p.writeUInt32LE(v, 4 * i));
  return p;
}

/** A frame whose payload is one u32: OK, UNREGISTER, LIST (the id to list from; 0 or 1 the start), UNOBSERVE, STATS_FD (0: the host). */
export function encodeU32Frame(type: number, v: number, flags = 0): Buffer {
  return encodeFrame(type, flags, u32Payload(v));
}

const U64_MAX = (1n << 64n) - 1n;

function u64(v: bigint): bigint {
  // Values are non-negative by construction; clamp instead of throwing inside a send path.
  return v < 0n ? 0n : v > U64_MAX ? U64_MAX : v;
}

/** A fixed run of little-endian fields, in wire order: each encoder and decoder of it walks this one table. */
type Fields = Readonly<Record<string, 'u32' | 'u64'>>;
type FieldValues<F extends Fields> = { -readonly [K in keyof F]: F[K] extends 'u32' ? number : bigint };

/** Writes `v` at `off` (u64s clamped as u64() does); returns the offset after the run. */
export function writeFields<F extends Fields>(p: Buffer, off: number, fields: F, v: FieldValues<F>): number {
  for (const [k, kind] of Object.entries(fields)) {
    if (kind === 'u32') p.writeUInt32LE(v[k] as number, off);
    else p.writeBigUInt64LE(u64(v[k] as bigint), off);
    off += kind === 'u32' ? 4 : 8;
  }
  return off;
}

export function readFields<F extends Fields>(p: Buffer, off: number, fields: F): FieldValues<F> {
  const out: Record<string, number | bigint> = {};
  for (const [k, kind] of Object.entries(fields)) {
    out[k] = kind === 'u32' ? p.readUInt32LE(off) : p.readBigUInt64LE(off);
    off += kind === 'u32' ? 4 : 8;
  }
  return out as FieldValues<F>;
}

/** A HOST_UPDATE package entry; unattributed_uj (u64) follows with FLAG_PER_PACKAGE. */
export const HOST_PKG_FIELDS = { pkg: 'u32', reserved: 'u32', energyUj: 'u64' } as const;
export const HOST_DOMAIN_FIELDS = { pkg: 'u32', code: 'u32', energyUj: 'u64', unattributedUj: 'u64' } as const;
export const REGISTERED_FIELDS = { vmId: 'u32', nvpkg: 'u32', powerUnit: 'u64' } as const;
export const VALUE_FIELDS = { vmId: 'u32', vpkg: 'u32', counter: 'u64', energyUj: 'u64', tNs: 'u64' } as const;

export function encodeRegistered(vmId: number, nvpkg: number, powerUnit: bigint): Buffer {
  const p = Buffer.alloc(16);
  writeFields(p, 0, REGISTERED_FIELDS, { vmId, nvpkg, powerUnit });
  return encodeFrame(T.REGISTERED, 0, p);
}

/** UPDATE's per-vpkg entry, at 16 + 16 x vpkg. */
export const VPKG_FIELDS = { counter: 'u64', energyUj: 'u64' } as const;
export type VpkgValue = FieldValues<typeof VPKG_FIELDS>;

export function encodeValue(vmId: number, vpkg: number, v: VpkgValue, tNs: bigint, ended: boolean): Buffer {
  const p = Buffer.alloc(32);
  writeFields(p, 0, VALUE_FIELDS, { vmId, vpkg, counter: v.counter, energyUj: v.energyUj, tNs });
  return encodeFrame(T.VALUE, ended ? FLAG_ENDED : 0, p);
}

/** A VM's energy of one RAPL domain other than the package, per virtual package (UPDATE's domain block). */
export interface VmDomainValues {
  domain: OtherDomain;
  /** µJ since the VM's baseline; index = vpkg, as many as the UPDATE's vpkg values. */
  vpkgEnergyUj: bigint[];
}

/** UPDATE; with `domains` (even empty: the client asked, the host has none) FLAG_DOMAINS and the domain block. */
export function encodeUpdate(
  vmId: number,
  tNs: bigint,
  values: readonly VpkgValue[],
  ended: boolean,
  domains?: readonly VmDomainValues[],
): Buffer {
  const n = values.length;
  const base = 16 + 16 * n;
  const size = domains === undefined ? base : base + DOMAIN_BLOCK_HEADER + domains.length * (VM_DOMAIN_FIXED + 8 * n);
  const p = Buffer.alloc(size);
  p.writeUInt32LE(vmId, 0);
  p.writeUInt32LE(n, 4);
  p.writeBigUInt64LE(u64(tNs), 8);
  values.forEach((v, i) => writeFields(p, 16 + 16 * i, VPKG_FIELDS, v));
  if (domains === undefined) return encodeFrame(T.UPDATE, ended ? FLAG_ENDED : 0, p);
  p.writeUInt32LE(domains.length, base);
  let off = base + DOMAIN_BLOCK_HEADER;
  for (const d of domains) {
    if (d.vpkgEnergyUj.length !== n)
      throw new RangeError(`UPDATE: the ${d.domain} domain has ${d.vpkgEnergyUj.length} values for ${n} vpkgs`);
    p.writeUInt32LE(domainCode(d.domain), off);
    d.vpkgEnergyUj.forEach((e, g) => p.writeBigUInt64LE(u64(e), off + VM_DOMAIN_FIXED + 8 * g));
    off += VM_DOMAIN_FIXED + 8 * n;
  }
  return encodeFrame(T.UPDATE, (ended ? FLAG_ENDED : 0) | FLAG_DOMAINS, p);
}

export const VM_ENTRY_FIELDS = { hostVmId: 'u32', pid: 'u32', uid: 'u32', nvpkg: 'u32', starttime: 'u64' } as const;
/** A VM_LIST entry's other flag bits, by the field each sets. */
export const VM_ENTRY_FLAGS = {
  ended: 0x1,
  /** Found by the helper's /proc scan, not registered by a client. */
  discovered: 0x2,
  /** The vCPU threads cannot be told apart: one virtual package holds the whole VM's energy. */
  wholeVmOnly: 0x4,
  /** Not every thread of the process is sampled: its energy is a lower bound. */
  notWhole: 0x10,
  /** Its guest reads its own VM's energy (--guest-energy exact). */
  guestExact: 0x20,
} as const;

/** One VM as LIST shows it. `uuid` is the 16 raw bytes of the VM's -uuid, `name` its -name (or registrant's). */
export type VmEntry = FieldValues<typeof VM_ENTRY_FIELDS> & {
  ended: boolean;
  discovered: boolean;
  wholeVmOnly: boolean;
  notWhole?: boolean;
  guestExact?: boolean;
  name: string | null;
  uuid: Buffer | null;
};

/** UTF-8 bytes of `s`, cut to at most `max` bytes without splitting a character. */
export function utf8Cut(s: string, max: number): Buffer {
  const b = Buffer.from(s, 'utf8');
  if (b.length <= max) return b;
  let end = max;
  // Back off over continuation bytes (10xxxxxx).
  while (end > 0 && (b[end]! & 0xc0) === 0x80) end--;
  return b.subarray(0, end);
}

function vmEntrySize(e: VmEntry): number {
  return VM_ENTRY_FIXED + (e.name === null ? 0 : utf8Cut(e.name, MAX_NAME_BYTES).length);
}

function writeVmEntry(p: Buffer, off: number, e: VmEntry): number {
  const name = e.name === null ? Buffer.alloc(0) : utf8Cut(e.name, MAX_NAME_BYTES);
  writeFields(p, off, VM_ENTRY_FIELDS, e);
  let flags = e.uuid !== null ? VM_HAS_UUID : 0;
  for (const [k, bit] of Object.entries(VM_ENTRY_FLAGS)) if (e[k as keyof typeof VM_ENTRY_FLAGS] === true) flags |= bit;
  p.writeUInt16LE(flags, off + 24);
  p.writeUInt8(name.length, off + 26);
  if (e.uuid !== null) e.uuid.copy(p, off + 28, 0, 16);
  name.copy(p, off + VM_ENTRY_FIXED);
  return off + VM_ENTRY_FIXED + name.length;
}

/** One VM_LIST page: the `entries` (sorted, filtered for the peer) that fit, and the id to ask for next (0: the last). */
export function encodeVmList(entries: readonly VmEntry[]): Buffer {
  let size = VM_LIST_HEADER;
  let n = 0;
  for (const e of entries) {
    const s = vmEntrySize(e);
    if (size + s > MAX_PAYLOAD) break;
    size += s;
    n++;
  }
  const p = Buffer.alloc(size);
  p.writeUInt32LE(n, 0);
  p.writeUInt32LE(n < entries.length ? entries[n]!.hostVmId : 0, 4);
  let off = VM_LIST_HEADER;
  for (let i = 0; i < n; i++) off = writeVmEntry(p, off, entries[i]!);
  return encodeFrame(T.VM_LIST, 0, p);
}

/** HOST_UPDATE's counters at byte 16; lastSampleDurationNs: the last sample's wall time; vms: with ended ones not yet dropped. */
export const DAEMON_COUNTER_FIELDS = {
  legacyOk: 'u64',
  legacyRefused: 'u64',
  legacyFailed: 'u64',
  lastSampleDurationNs: 'u64',
  samples: 'u64',
  sampleFailures: 'u64',
  connections: 'u32',
  vms: 'u32',
} as const;
export type DaemonCounters = FieldValues<typeof DAEMON_COUNTER_FIELDS>;

/** One host package in a HOST_UPDATE: energy since the helper started sampling, µJ. */
export interface HostPackageValues {
  pkg: number;
  energyUj: bigint;
  /** The part attributed to no VM, µJ; null when the frame does not carry it (no FLAG_PER_PACKAGE). */
  unattributedUj: bigint | null;
}

/** One other RAPL domain of one host package in a HOST_UPDATE (psys under the package it is read on). */
export interface HostDomainValues {
  pkg: number;
  domain: OtherDomain;
  energyUj: bigint;
  unattributedUj: bigint;
}

export interface HostValues {
  /** CLOCK_MONOTONIC of the sample the values come from (0 before the first interval). */
  tNs: bigint;
  /** Either every package has its unattributedUj or none has (FLAG_PER_PACKAGE). */
  packages: HostPackageValues[];
  /** Present when the frame carries them (FLAG_HOST_DOMAINS; empty when the host reads only the package). */
  domains?: HostDomainValues[];
  /** Package energy attributed to no VM, summed over packages, µJ. */
  unattributedUj: bigint;
  vmsChanged: boolean;
  stats: DaemonCounters;
}

/** HOST_UPDATE, with FLAG_PER_PACKAGE when the packages carry their unattributed energy. */
export function encodeHostUpdate(h: HostValues): Buffer {
  const perPackage = h.packages.length > 0 && h.packages[0]!.unattributedUj !== null;
  if (h.packages.some((k) => (k.unattributedUj !== null) !== perPackage))
    throw new RangeError('HOST_UPDATE: either every package carries its unattributed energy or none does');
  const entry = perPackage ? HOST_PKG_SIZE_PER_PACKAGE : HOST_PKG_SIZE;
  const base = HOST_UPDATE_FIXED + entry * h.packages.length;
  const domains = h.domains;
  const p = Buffer.alloc(domains === undefined ? base : base + DOMAIN_BLOCK_HEADER + HOST_DOMAIN_SIZE * domains.length);
  p.writeBigUInt64LE(u64(h.tNs), 0);
  p.writeBigUInt64LE(u64(h.unattributedUj), 8);
  writeFields(p, 16, DAEMON_COUNTER_FIELDS, { ...h.stats, connections: h.stats.connections >>> 0, vms: h.stats.vms >>> 0 });
  p.writeUInt32LE(h.packages.length, 72);
  h.packages.forEach((k, i) => {
    const off = HOST_UPDATE_FIXED + entry * i;
    writeFields(p, off, HOST_PKG_FIELDS, { pkg: k.pkg, reserved: 0, energyUj: k.energyUj });
    if (k.unattributedUj !== null) p.writeBigUInt64LE(u64(k.unattributedUj), off + 16);
  });
  if (domains !== undefined) {
    p.writeUInt32LE(domains.length, base);
    domains.forEach((d, i) => {
      writeFields(p, base + DOMAIN_BLOCK_HEADER + HOST_DOMAIN_SIZE * i, HOST_DOMAIN_FIELDS, { ...d, code: domainCode(d.domain) });
    });
  }
  const flags =
    (h.vmsChanged ? FLAG_VMS_CHANGED : 0) | (perPackage ? FLAG_PER_PACKAGE : 0) | (domains !== undefined ? FLAG_HOST_DOMAINS : 0);
  return encodeFrame(T.HOST_UPDATE, flags, p);
}

/** STATS_FD's reply: the id asked for (0 = the host) and the size of the file whose fd comes with it. */
export function encodeStatsFdReply(hostVmId: number, fileSize: number): Buffer {
  return encodeFrame(T.STATS_FD_REPLY, 0, u32Payload(hostVmId, fileSize));
}

export const LIMIT_STATE_FIELDS = { vmId: 'u32', limitMw: 'u32', quotaUs: 'u32', periodUs: 'u32', limitedNs: 'u64' } as const;

/** LIMIT_STATE's limit (0 mW: none; quotaUs 0: no quota now); `domain` when the LIMIT named one, absent: the package. */
export type LimitState = FieldValues<typeof LIMIT_STATE_FIELDS> & { domain?: EnergyDomain };

export function encodeLimitState(s: LimitState): Buffer {
  const p = Buffer.alloc(LIMIT_STATE_SIZE + (s.domain === undefined ? 0 : 8));
  writeFields(p, 0, LIMIT_STATE_FIELDS, s);
  if (s.domain !== undefined) p.writeUInt32LE(ENERGY_DOMAINS.indexOf(s.domain), LIMIT_STATE_SIZE);
  return encodeFrame(T.LIMIT_STATE, s.domain === undefined ? 0 : LIMIT_STATE_DOMAIN, p);
}

/** Messages are cut (at a character boundary) so the frame stays within MAX_PAYLOAD. */
export function encodeError(code: number, requestType: number, message: string): Buffer {
  const text = utf8Cut(message, MAX_PAYLOAD - 8);
  const p = Buffer.alloc(8 + text.length);
  p.writeUInt32LE(code, 0);
  p.writeUInt32LE(requestType, 4);
  text.copy(p, 8);
  return encodeFrame(T.ERROR, 0, p);
}

interface RegisterRequest {
  pid: number;
  vcpus: readonly VcpuSpec[];
}

export function encodeRegister(r: RegisterRequest): Buffer {
  const p = Buffer.alloc(8 + 8 * r.vcpus.length);
  p.writeUInt32LE(r.pid, 0);
  p.writeUInt32LE(r.vcpus.length, 4);
  r.vcpus.forEach((v, i) => {
    p.writeUInt32LE(v.tid, 8 + 8 * i);
    p.writeUInt32LE(v.vpkg, 12 + 8 * i);
  });
  return encodeFrame(T.REGISTER, 0, p);
}

export function encodeRead(vmId: number, vpkg: number): Buffer {
  return encodeFrame(T.READ, 0, u32Payload(vmId, vpkg));
}

/** SUBSCRIBE; `domains` asks for the domain block in this VM's UPDATEs (a helper before it answers ERROR 1). */
export function encodeSubscribe(vmId: number, o: { domains?: boolean } = {}): Buffer {
  return encodeU32Frame(T.SUBSCRIBE, vmId, o.domains === true ? WATCH_DOMAINS : 0);
}

/** OBSERVE; `domains` as for SUBSCRIBE. */
export function encodeObserve(hostVmId: number, o: { domains?: boolean } = {}): Buffer {
  return encodeU32Frame(T.OBSERVE, hostVmId, o.domains === true ? WATCH_DOMAINS : 0);
}

/** LIMIT: with `milliwatts` (0 = off) sets VM `hostVmId`'s power limit; without, reads it; with `domain`, the first layout's package. */
export function encodeLimit(hostVmId: number, milliwatts?: number, domain?: EnergyDomain): Buffer {
  const p = u32Payload(hostVmId, milliwatts ?? 0, ...(domain === undefined ? [] : [ENERGY_DOMAINS.indexOf(domain)]));
  return encodeFrame(T.LIMIT, (milliwatts === undefined ? 0 : LIMIT_SET) | (domain === undefined ? 0 : LIMIT_DOMAIN), p);
}

/** HOST_SUBSCRIBE; `perPackage` and `domains` ask for those layouts (a helper before either answers ERROR 1). */
export function encodeHostSubscribe(o: { perPackage: boolean; domains?: boolean } = { perPackage: false }): Buffer {
  const flags = (o.perPackage ? HOST_SUBSCRIBE_PER_PACKAGE : 0) | (o.domains === true ? HOST_SUBSCRIBE_DOMAINS : 0);
  return encodeFrame(T.HOST_SUBSCRIBE, flags, Buffer.alloc(0));
}
