/** Payload validation per frame type, both ways; a client's payload of the wrong size is `fatal` (ERROR 1, then close). */
import {
  DOMAIN_BLOCK_HEADER,
  E,
  FLAG_DOMAINS,
  FLAG_ENDED,
  FLAG_HOST_DOMAINS,
  FLAG_PER_PACKAGE,
  FLAG_VMS_CHANGED,
  HOST_PKG_SIZE,
  HOST_DOMAIN_SIZE,
  HOST_PKG_SIZE_PER_PACKAGE,
  HOST_SUBSCRIBE_DOMAINS,
  HOST_SUBSCRIBE_PER_PACKAGE,
  LIMIT_DOMAIN,
  LIMIT_SET,
  LIMIT_STATE_DOMAIN,
  LIMIT_STATE_SIZE,
  type LimitState,
  HOST_UPDATE_FIXED,
  VPKG_FIELDS,
  HOST_PKG_FIELDS,
  HOST_DOMAIN_FIELDS,
  T,
  VM_DOMAIN_FIXED,
  VM_ENTRY_FIXED,
  VM_ENTRY_FIELDS,
  VM_ENTRY_FLAGS,
  VM_HAS_UUID,
  VM_LIST_HEADER,
  WATCH_DOMAINS,
  domainOfCode,
  type HostDomainValues,
  type HostPackageValues,
  type HostValues,
  type VmDomainValues,
  type VmEntry,
  type VpkgValue,
  typeName,
  readFields,
  REGISTERED_FIELDS,
  VALUE_FIELDS,
  DAEMON_COUNTER_FIELDS,
  LIMIT_STATE_FIELDS,
} from './codec.js';
import { type Frame } from './frame-decoder.js';
import { ENERGY_DOMAINS, type EnergyDomain } from '../../model/domains.js';
import { checkVcpus, MAX_TID, MAX_VCPUS, type VcpuSpec } from '../../model/vcpus.js';
import { fail, ok, type Result } from '../../common/result.js';

interface PayloadError {
  code: number;
  message: string;
  /** The framing itself is broken: answer, then close. */
  fatal: boolean;
}

export type ClientRequest =
  | { type: typeof T.REGISTER; pid: number; vcpus: VcpuSpec[] }
  | { type: typeof T.READ; vmId: number; vpkg: number }
  /** domains: flag WATCH_DOMAINS. */
  | { type: typeof T.SUBSCRIBE; vmId: number; domains: boolean }
  | { type: typeof T.UNREGISTER; vmId: number }
  | { type: typeof T.LIST; fromId: number }
  | { type: typeof T.OBSERVE; vmId: number; domains: boolean }
  | { type: typeof T.UNOBSERVE; vmId: number }
  /** perPackage: flag HOST_SUBSCRIBE_PER_PACKAGE; domains: HOST_SUBSCRIBE_DOMAINS. */
  | { type: typeof T.HOST_SUBSCRIBE; perPackage: boolean; domains: boolean }
  /** vmId 0 = the host's file. */
  | { type: typeof T.STATS_FD; vmId: number }
  /** milliwatts: the limit to set (0 = remove), null = only read it; domain: when named (LIMIT_DOMAIN). */
  | { type: typeof T.LIMIT; vmId: number; milliwatts: number | null; domain?: EnergyDomain };

type ClientParse = Result<ClientRequest, PayloadError>;

function wrongSize(type: number, got: number, want: string): ClientParse {
  return fail({ code: E.MALFORMED, fatal: true, message: `${typeName(type)} payload is ${got} bytes, expected ${want}` });
}

function bad(message: string): ClientParse {
  return fail({ code: E.MALFORMED, fatal: false, message });
}

/** The refusal of flags other than the `named` bits (each with what it asks for); null when they are fine. */
function onlyFlags(f: Frame, named: readonly (readonly [number, string])[] = []): ClientParse | null {
  if ((f.flags & ~named.reduce((m, [bit]) => m | bit, 0)) === 0) return null;
  const each = named.map(([bit, what]) => `0x${bit.toString(16)} (${what})`);
  const may = each.length === 0 ? '0' : each.length === 1 ? `0 or ${each[0]}` : `0 or a mix of ${each.join(' and ')}`;
  return bad(`flags must be ${may}, got 0x${f.flags.toString(16)}`);
}

/** The refusal of a frame whose payload is not `size` bytes or whose flags are not the `named` bits; null when it is fine. */
function plainFrame(f: Frame, size: number, named?: readonly (readonly [number, string])[]): ClientParse | null {
  return f.payload.length !== size ? wrongSize(f.type, f.payload.length, String(size)) : onlyFlags(f, named);
}

/** A client's request from a decoded frame (whose type the decoder already checked). */
export function parseClientFrame(f: Frame): ClientParse {
  const p = f.payload;
  switch (f.type) {
    case T.REGISTER: {
      if (p.length < 8) return wrongSize(f.type, p.length, 'at least 8');
      const pid = p.readUInt32LE(0);
      const nvcpu = p.readUInt32LE(4);
      // A lying count is a size error: length must be exactly 8 + 8 * nvcpu.
      if (p.length !== 8 + 8 * nvcpu) return wrongSize(f.type, p.length, `8 + 8 x nvcpu (${nvcpu}) = ${8 + 8 * nvcpu}`);
      const flagsBad = onlyFlags(f);
      if (flagsBad !== null) return flagsBad;
      // The count is checked before the list is read: the frame's size already bounds it, this keeps it cheap.
      if (nvcpu < 1 || nvcpu > MAX_VCPUS) return bad(`nvcpu must be 1..${MAX_VCPUS}, got ${nvcpu}`);
      if (pid > MAX_TID) return bad(`pid ${pid} is out of range (0..${MAX_TID})`);
      const list: VcpuSpec[] = [];
      for (let i = 0; i < nvcpu; i++) list.push({ tid: p.readUInt32LE(8 + 8 * i), vpkg: p.readUInt32LE(12 + 8 * i) });
      const vcpus = checkVcpus(list);
      if (!vcpus.ok) return bad(vcpus.error);
      return ok({ type: T.REGISTER, pid, vcpus: vcpus.value });
    }
    case T.READ:
      return plainFrame(f, 8) ?? ok({ type: T.READ, vmId: p.readUInt32LE(0), vpkg: p.readUInt32LE(4) });
    case T.SUBSCRIBE:
    case T.OBSERVE:
      return (
        plainFrame(f, 4, [[WATCH_DOMAINS, 'other RAPL domains']]) ??
        ok({ type: f.type, vmId: p.readUInt32LE(0), domains: (f.flags & WATCH_DOMAINS) !== 0 })
      );
    case T.UNREGISTER:
    case T.UNOBSERVE:
    case T.STATS_FD:
      return plainFrame(f, 4) ?? ok({ type: f.type, vmId: p.readUInt32LE(0) });
    case T.LIMIT:
      return parseLimit(f);
    case T.LIST:
      return plainFrame(f, 4) ?? ok({ type: T.LIST, fromId: p.readUInt32LE(0) });
    case T.HOST_SUBSCRIBE:
      return (
        plainFrame(f, 0, [
          [HOST_SUBSCRIBE_PER_PACKAGE, 'per-package unattributed energy'],
          [HOST_SUBSCRIBE_DOMAINS, 'other RAPL domains'],
        ]) ??
        ok({
          type: T.HOST_SUBSCRIBE,
          perPackage: (f.flags & HOST_SUBSCRIBE_PER_PACKAGE) !== 0,
          domains: (f.flags & HOST_SUBSCRIBE_DOMAINS) !== 0,
        })
      );
    default:
      return fail({ code: E.MALFORMED, fatal: true, message: `unknown frame type ${typeName(f.type)}` });
  }
}

export type HelperMessage =
  | { type: typeof T.REGISTERED; vmId: number; nvpkg: number; powerUnit: bigint }
  | { type: typeof T.VALUE; vmId: number; vpkg: number; counter: bigint; energyUj: bigint; tNs: bigint; ended: boolean }
  /** domains: present with FLAG_DOMAINS. */
  | { type: typeof T.UPDATE; vmId: number; tNs: bigint; vpkgs: VpkgValue[]; ended: boolean; domains?: VmDomainValues[] }
  | { type: typeof T.OK; vmId: number }
  | { type: typeof T.VM_LIST; entries: VmEntry[]; nextId: number }
  | ({ type: typeof T.HOST_UPDATE } & HostValues)
  | { type: typeof T.STATS_FD_REPLY; vmId: number; fileSize: number }
  | ({ type: typeof T.LIMIT_STATE } & LimitState)
  | { type: typeof T.ERROR; code: number; requestType: number; message: string };

/** A helper's reply; a failure describes a reply the client cannot trust (the client then closes). */
export function parseHelperFrame(f: Frame): Result<HelperMessage> {
  const p = f.payload;
  switch (f.type) {
    case T.REGISTERED:
      if (p.length !== 16) return wrongLength(f, 16);
      return ok({ type: T.REGISTERED, ...readFields(p, 0, REGISTERED_FIELDS) });
    case T.VALUE:
      if (p.length !== 32) return wrongLength(f, 32);
      return ok({ type: T.VALUE, ...readFields(p, 0, VALUE_FIELDS), ended: (f.flags & FLAG_ENDED) !== 0 });
    case T.UPDATE:
      return parseUpdate(f);
    case T.OK:
      if (p.length !== 4) return wrongLength(f, 4);
      return ok({ type: T.OK, vmId: p.readUInt32LE(0) });
    case T.VM_LIST:
      return parseVmList(p);
    case T.HOST_UPDATE:
      return parseHostUpdate(f);
    case T.STATS_FD_REPLY:
      if (p.length !== 8) return wrongLength(f, 8);
      return ok({ type: T.STATS_FD_REPLY, vmId: p.readUInt32LE(0), fileSize: p.readUInt32LE(4) });
    case T.LIMIT_STATE:
      return parseLimitState(f);
    case T.ERROR:
      if (p.length < 8) return fail(`ERROR payload is ${p.length} bytes, expected at least 8`);
      return ok({ type: T.ERROR, code: p.readUInt32LE(0), requestType: p.readUInt32LE(4), message: p.subarray(8).toString('utf8') });
    default:
      return fail(`unknown frame type ${typeName(f.type)}`);
  }
}

function wrongLength(f: Frame, want: number): Result<never> {
  return fail(`${typeName(f.type)} payload is ${f.payload.length} bytes, expected ${want}`);
}

/** UPDATE: the vpkg values, then the domain block with FLAG_DOMAINS. */
function parseUpdate(f: Frame): Result<HelperMessage> {
  const p = f.payload;
  if (p.length < 16) return wrongLength(f, 16);
  const n = p.readUInt32LE(4);
  const base = 16 + 16 * n;
  const withDomains = (f.flags & FLAG_DOMAINS) !== 0;
  if (!withDomains && p.length !== base) return wrongLength(f, base);
  if (withDomains && p.length < base + DOMAIN_BLOCK_HEADER) return wrongLength(f, base + DOMAIN_BLOCK_HEADER);
  const vpkgs: VpkgValue[] = [];
  for (let i = 0; i < n; i++) vpkgs.push(readFields(p, 16 + 16 * i, VPKG_FIELDS));
  const m = { type: T.UPDATE, vmId: p.readUInt32LE(0), tNs: p.readBigUInt64LE(8), vpkgs, ended: (f.flags & FLAG_ENDED) !== 0 } as const;
  if (!withDomains) return ok(m);
  const domains = parseVmDomains(p, base, n);
  return domains.ok ? ok({ ...m, domains: domains.value }) : domains;
}

/** HOST_UPDATE, its layout named by its flags. */
function parseHostUpdate(f: Frame): Result<HelperMessage> {
  const p = f.payload;
  if (p.length < HOST_UPDATE_FIXED) return wrongLength(f, HOST_UPDATE_FIXED);
  const n = p.readUInt32LE(72);
  const perPackage = (f.flags & FLAG_PER_PACKAGE) !== 0;
  const entry = perPackage ? HOST_PKG_SIZE_PER_PACKAGE : HOST_PKG_SIZE;
  const base = HOST_UPDATE_FIXED + entry * n;
  const withDomains = (f.flags & FLAG_HOST_DOMAINS) !== 0;
  if (!withDomains && p.length !== base) return wrongLength(f, base);
  if (withDomains && p.length < base + DOMAIN_BLOCK_HEADER) return wrongLength(f, base + DOMAIN_BLOCK_HEADER);
  const packages: HostPackageValues[] = [];
  for (let i = 0; i < n; i++) {
    const off = HOST_UPDATE_FIXED + entry * i;
    const { pkg, energyUj } = readFields(p, off, HOST_PKG_FIELDS);
    packages.push({ pkg, energyUj, unattributedUj: perPackage ? p.readBigUInt64LE(off + 16) : null });
  }
  let domains: HostDomainValues[] | undefined;
  if (withDomains) {
    const d = parseHostDomains(p, base, new Set(packages.map((k) => k.pkg)));
    if (!d.ok) return d;
    domains = d.value;
  }
  return ok({
    type: T.HOST_UPDATE,
    ...(domains !== undefined ? { domains } : {}),
    tNs: p.readBigUInt64LE(0),
    unattributedUj: p.readBigUInt64LE(8),
    packages,
    vmsChanged: (f.flags & FLAG_VMS_CHANGED) !== 0,
    stats: readFields(p, 16, DAEMON_COUNTER_FIELDS),
  });
}

/** Other RAPL domains a domain block may hold at most: each once. */
const MAX_OTHER_DOMAINS = ENERGY_DOMAINS.length - 1;

function codeDomain(what: string, code: number): Result<NonNullable<ReturnType<typeof domainOfCode>>> {
  const d = domainOfCode(code);
  if (d === null) {
    const known = ENERGY_DOMAINS.slice(1)
      .map((x, i) => `${i + 1} ${x}`)
      .join(', ');
    return fail(`${what}: domain code ${code} is not one this client knows (${known}); update the client to read it`);
  }
  return ok(d);
}

/** UPDATE's domain block from `off`: each domain once, ending exactly at the payload's end. */
function parseVmDomains(p: Buffer, off: number, n: number): Result<VmDomainValues[]> {
  const count = p.readUInt32LE(off);
  if (count > MAX_OTHER_DOMAINS) return fail(`UPDATE carries ${count} domains, at most ${MAX_OTHER_DOMAINS} exist besides the package`);
  const entry = VM_DOMAIN_FIXED + 8 * n;
  const want = off + DOMAIN_BLOCK_HEADER + count * entry;
  if (p.length !== want) return fail(`UPDATE payload is ${p.length} bytes, expected ${want} (${n} vpkgs, ${count} domains)`);
  const out: VmDomainValues[] = [];
  for (let i = 0, at = off + DOMAIN_BLOCK_HEADER; i < count; i++, at += entry) {
    const d = codeDomain(`UPDATE domain entry ${i}`, p.readUInt32LE(at));
    if (!d.ok) return d;
    if (out.some((x) => x.domain === d.value)) return fail(`UPDATE carries the ${d.value} domain twice`);
    const vpkgEnergyUj: bigint[] = [];
    for (let g = 0; g < n; g++) vpkgEnergyUj.push(p.readBigUInt64LE(at + VM_DOMAIN_FIXED + 8 * g));
    out.push({ domain: d.value, vpkgEnergyUj });
  }
  return ok(out);
}

/** HOST_UPDATE's domain block from `off` to the payload's end: each (package, domain) once, each package one the frame lists. */
function parseHostDomains(p: Buffer, off: number, packages: ReadonlySet<number>): Result<HostDomainValues[]> {
  const count = p.readUInt32LE(off);
  const want = off + DOMAIN_BLOCK_HEADER + HOST_DOMAIN_SIZE * count;
  if (count > packages.size * MAX_OTHER_DOMAINS || p.length !== want)
    return fail(`HOST_UPDATE payload is ${p.length} bytes, expected ${want} (${count} domain entries for ${packages.size} packages)`);
  const out: HostDomainValues[] = [];
  const seen = new Set<string>();
  for (let i = 0, at = off + DOMAIN_BLOCK_HEADER; i < count; i++, at += HOST_DOMAIN_SIZE) {
    const { pkg, code, energyUj, unattributedUj } = readFields(p, at, HOST_DOMAIN_FIELDS);
    const d = codeDomain(`HOST_UPDATE domain entry ${i}`, code);
    if (!d.ok) return d;
    if (!packages.has(pkg)) return fail(`HOST_UPDATE domain entry ${i} names package ${pkg}, which the frame does not list`);
    const key = `${pkg} ${d.value}`;
    if (seen.has(key)) return fail(`HOST_UPDATE carries the ${d.value} domain of package ${pkg} twice`);
    seen.add(key);
    out.push({ pkg, domain: d.value, energyUj, unattributedUj });
  }
  return ok(out);
}

/** A VM_LIST payload: every entry must lie inside it and the count must match exactly. */
function parseVmList(p: Buffer): Result<HelperMessage> {
  if (p.length < VM_LIST_HEADER) return fail(`VM_LIST payload is ${p.length} bytes, expected at least ${VM_LIST_HEADER}`);
  const count = p.readUInt32LE(0);
  const nextId = p.readUInt32LE(4);
  const entries: VmEntry[] = [];
  let off = VM_LIST_HEADER;
  for (let i = 0; i < count; i++) {
    if (off + VM_ENTRY_FIXED > p.length) return fail(`VM_LIST entry ${i} is cut off at byte ${p.length}`);
    const flags = p.readUInt16LE(off + 24);
    const nameLen = p.readUInt8(off + 26);
    if (off + VM_ENTRY_FIXED + nameLen > p.length) return fail(`VM_LIST entry ${i}: its name is cut off at byte ${p.length}`);
    const bits = Object.entries(VM_ENTRY_FLAGS).map(([k, bit]) => [k, (flags & bit) !== 0]);
    entries.push({
      ...readFields(p, off, VM_ENTRY_FIELDS),
      ...(Object.fromEntries(bits) as Record<keyof typeof VM_ENTRY_FLAGS, boolean>),
      uuid: (flags & VM_HAS_UUID) !== 0 ? Buffer.from(p.subarray(off + 28, off + 44)) : null,
      name: nameLen > 0 ? p.subarray(off + VM_ENTRY_FIXED, off + VM_ENTRY_FIXED + nameLen).toString('utf8') : null,
    });
    off += VM_ENTRY_FIXED + nameLen;
  }
  if (off !== p.length) return fail(`VM_LIST payload has ${p.length - off} bytes after its ${count} entries`);
  return ok({ type: T.VM_LIST, entries, nextId });
}

/** LIMIT: 8 bytes, or 12 with LIMIT_DOMAIN (the domain code after the milliwatts). */
function parseLimit(f: Frame): ClientParse {
  const p = f.payload;
  const withDomain = (f.flags & LIMIT_DOMAIN) !== 0;
  const flagsBad = plainFrame(f, withDomain ? 12 : 8, [
    [LIMIT_SET, 'set'],
    [LIMIT_DOMAIN, 'domain'],
  ]);
  if (flagsBad !== null) return flagsBad;
  const domain = withDomain ? ENERGY_DOMAINS[p.readUInt32LE(8)] : undefined;
  if (withDomain && domain === undefined)
    return bad(`domain code ${p.readUInt32LE(8)} names no RAPL domain (0 to ${ENERGY_DOMAINS.length - 1}: ${ENERGY_DOMAINS.join(', ')})`);
  const milliwatts = (f.flags & LIMIT_SET) !== 0 ? p.readUInt32LE(4) : null;
  return ok({ type: T.LIMIT, vmId: p.readUInt32LE(0), milliwatts, ...(domain !== undefined ? { domain } : {}) });
}

/** LIMIT_STATE: 24 bytes, or 32 with LIMIT_STATE_DOMAIN (u32 domain code, u32 reserved). */
function parseLimitState(f: Frame): Result<HelperMessage> {
  const p = f.payload;
  const withDomain = (f.flags & LIMIT_STATE_DOMAIN) !== 0;
  const size = LIMIT_STATE_SIZE + (withDomain ? 8 : 0);
  if (p.length !== size) return wrongLength(f, size);
  const domain = withDomain ? ENERGY_DOMAINS[p.readUInt32LE(LIMIT_STATE_SIZE)] : undefined;
  if (withDomain && domain === undefined) return fail(`LIMIT_STATE names domain code ${p.readUInt32LE(LIMIT_STATE_SIZE)}, no RAPL domain`);
  return ok({ type: T.LIMIT_STATE, ...readFields(p, 0, LIMIT_STATE_FIELDS), ...(domain !== undefined ? { domain } : {}) });
}
