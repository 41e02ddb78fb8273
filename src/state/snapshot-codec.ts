/**
 * The continuity record on the wire, pure: a restart's, a stop into systemd's fd store's and every checkpoint's
 * (docs/daemon.md "Restart state"). Little-endian: magic "VMSRSTAT" | u32 format version | u32 payload length |
 * u32 CRC-32 (zlib's) of the payload | u32 hand-over length (version 4 on; 0 before and in a checkpoint); the
 * payload, field by field as payloadIo and the sections it calls say; at its end the hand-over (handoverIo).
 * Read as hostile input: every count is bounded (STATE_LIMITS) and checked against the bytes left before
 * anything is allocated for it, and the decoded value passes the encoder's check (stateProblem).
 */
import zlib from 'node:zlib';
import { cannot } from '../common/errors.js';
import { fail, ok, type Result } from '../common/result.js';
import { checkVcpus, MAX_TID, MAX_VCPUS, MAX_VPKG } from '../model/vcpus.js';
import { ENERGY_DOMAINS, isOtherDomain, type OtherDomain } from '../model/domains.js';
import { firstTime, Reader, Refused, STATE_HEADER_SIZE, Writer, type Io } from './byte-io.js';
import { guestCountersIo, guestCountersProblem } from './guest-codec.js';
import { powerLimitsIo, powerLimitsProblem } from './limit-codec.js';
import { handoverIo, handoverProblem } from './handover-codec.js';
import { STATE_LIMITS, type DomainsState, type Handover, type StateSnapshot, type VmState } from './snapshot.js';

const STATE_MAGIC: Buffer = Buffer.from('VMSRSTAT', 'latin1');
export const STATE_FORMAT_VERSION = 4;
/** 1 has no other-domains section, 2 no guest counters, 3 no power limits and no hand-over. */
const READABLE_VERSIONS: readonly number[] = [1, 2, 3, 4];
/** The largest snapshot, header included: what a reader may allocate for one. */
export const MAX_STATE_BYTES = STATE_HEADER_SIZE + STATE_LIMITS.maxPayloadBytes;

/** Host VM ids are u32 and never 0 (0 means "none" in VM_LIST's next_id). */
const MAX_HOST_VM_ID = 0xffffffff;
const NO_OWNER = 0xffffffff;
const FLAG = { DISCOVERED: 1, LIVE: 2, WHOLE_VM_ONLY: 4, HAS_UUID: 8, HAS_NAME: 16, BASELINE: 32 } as const;
const KNOWN_FLAGS = 63;
const UUID_BYTES = 16;
export const FIX = 'start without the saved state (registered VMs register again, discovery finds the rest)';

const isPid = (n: number) => Number.isInteger(n) && n >= 1 && n <= MAX_TID;
const isJoules = (j: number) => typeof j === 'number' && Number.isFinite(j) && j >= 0;
/** A total in joules and the µJ published from it agree: µJ = floor(J * 1e6) (ratio.md "Outputs"). */
const joulesMatch = (j: number, uj: bigint) => {
  if (!isJoules(j)) return false;
  // Finite joules past 1.8e302 are infinite µJ, which BigInt() refuses by throwing: no µJ gives them.
  const micro = Math.floor(j * 1e6);
  return Number.isFinite(micro) && BigInt(micro) === uj;
};

function vmProblem(vm: VmState, next: number, lastNs: bigint | null): string | null {
  const id = vm.hostVmId;
  const at = `VM ${id}`;
  if (!Number.isInteger(id) || id < 1 || id >= next) return `VM id ${id} is out of range (1..${next - 1}, below the next id ${next})`;
  if (!isPid(vm.pid)) return `${at}: pid ${vm.pid} is out of range (1..${MAX_TID})`;
  if (vm.owner === NO_OWNER) return `${at}: owner connection ${vm.owner} is out of range`;
  if (vm.owner === null && !vm.discovered) return `${at} is neither registered (no owner) nor discovered`;
  // A lone surrogate would be written as U+FFFD and come back as another name.
  if (vm.name !== null && Buffer.from(vm.name, 'utf8').toString('utf8') !== vm.name) return `${at}: its name is not valid Unicode`;
  if (vm.uuid !== null && vm.uuid.length !== UUID_BYTES) return `${at}: its uuid is ${vm.uuid.length} bytes, not ${UUID_BYTES}`;
  if (vm.baseline && !vm.live) return `${at} has ended but is marked as having its baseline`;
  if (vm.baseline && lastNs === null) return `${at} is marked as having its baseline, but there is no last sample`;
  if (lastNs !== null && vm.valuesNs > lastNs) return `${at}: its values' time ${vm.valuesNs} ns is after the last sample`;
  if (vm.vpkgs.length < 1) return `${at} has no virtual package`;
  const vcpus = checkVcpus(vm.vcpus, { allowEmpty: true });
  if (!vcpus.ok) return `${at}: ${vcpus.error}`;
  const outside = vm.vcpus.find((v) => v.vpkg >= vm.vpkgs.length);
  if (outside) return `${at}: thread ${outside.tid} is in virtual package ${outside.vpkg}, the VM has ${vm.vpkgs.length}`;
  for (let p = 0; p < vm.vpkgs.length; p++) {
    const v = vm.vpkgs[p]!;
    if (typeof v.counter !== 'bigint' || v.counter < 0n || v.counter > 0xffffffffn)
      return `${at}, virtual package ${p}: counter ${v.counter} is out of range (0..2^32-1)`;
    if (!joulesMatch(v.energyJ, v.energyUj)) return `${at}, virtual package ${p}: ${v.energyJ} J does not give ${v.energyUj} µJ`;
  }
  return null;
}

/** Why a snapshot cannot be saved or restored, or null when it keeps every rule (each field's range and each list's bound: Io). */
export function stateProblem(s: StateSnapshot): string | null {
  const once = firstTime();
  if (!Number.isInteger(s.nextHostVmId) || s.nextHostVmId < 1 || s.nextHostVmId > MAX_HOST_VM_ID)
    return `the next VM id ${s.nextHostVmId} is out of range (1..${MAX_HOST_VM_ID})`;
  for (const vm of s.vms) {
    const p = vmProblem(vm, s.nextHostVmId, s.lastSample?.monotonicNs ?? null);
    if (p !== null) return p;
    if (!once(`vm ${vm.hostVmId}`)) return `VM id ${vm.hostVmId} appears twice`;
  }
  for (const k of s.packages) {
    if (!joulesMatch(k.energyJ, k.energyUj) || !joulesMatch(k.unattributedJ, k.unattributedUj))
      return `package ${k.pkg}: its totals in J and µJ disagree`;
    if (!once(`pkg ${k.pkg}`)) return `package ${k.pkg} appears twice in the totals`;
  }
  for (const k of s.knownPids) {
    if (!isPid(k.pid)) return `known process ${k.pid} is out of range`;
    if (!once(`pid ${k.pid}`)) return `known process ${k.pid} appears twice`;
  }
  for (const k of s.lastSample?.packages ?? []) if (!once(`raw ${k.pkg}`)) return `package ${k.pkg} appears twice in the last sample`;
  for (const th of s.lastSample?.threads ?? []) {
    if (!isPid(th.pid) || !isPid(th.tid)) return `the last sample's thread ${th.tid} is out of range`;
    if (!once(`tid ${th.tid}`)) return `thread ${th.tid} appears twice in the last sample`;
  }
  return guestCountersProblem(s.guest ?? []) ?? powerLimitsProblem(s.limits ?? []) ?? (s.domains ? domainsProblem(s.domains, s) : null);
}

/** Why the other-domains section breaks a rule, or null (a domain code that is not one: domainIo). */
function domainsProblem(d: DomainsState, s: StateSnapshot): string | null {
  const vpkgsOf = new Map(s.vms.map((v) => [v.hostVmId, v.vpkgs.length]));
  const once = firstTime();
  for (const v of d.vms) {
    const n = vpkgsOf.get(v.hostVmId);
    if (n === undefined) return `${v.domain} totals for VM ${v.hostVmId}, which the snapshot does not have`;
    if (v.energyJ.length > n) return `VM ${v.hostVmId}: ${v.energyJ.length} ${v.domain} totals for ${n} virtual packages`;
    if (!v.energyJ.every(isJoules)) return `VM ${v.hostVmId}: a ${v.domain} total is not a finite number of joules >= 0`;
    if (!once(`vm ${v.hostVmId} ${v.domain}`)) return `VM ${v.hostVmId} has ${v.domain} totals twice`;
  }
  for (const k of d.packages) {
    if (!isJoules(k.energyJ) || !isJoules(k.unattributedJ))
      return `package ${k.pkg}: a ${k.domain} total is not a finite number of joules >= 0`;
    if (!once(`pkg ${k.pkg} ${k.domain}`)) return `package ${k.pkg} has ${k.domain} totals twice`;
  }
  if (d.counters.length > 0 && s.lastSample === null) return 'other-domain counters without a last sample';
  for (const k of d.counters) if (!once(`raw ${k.pkg} ${k.domain}`)) return `package ${k.pkg}'s ${k.domain} counter appears twice`;
  return null;
}

const bits = (vm: VmState) =>
  (vm.discovered ? FLAG.DISCOVERED : 0) |
  (vm.live ? FLAG.LIVE : 0) |
  (vm.wholeVmOnly ? FLAG.WHOLE_VM_ONLY : 0) |
  (vm.uuid !== null ? FLAG.HAS_UUID : 0) |
  (vm.name !== null ? FLAG.HAS_NAME : 0) |
  (vm.baseline ? FLAG.BASELINE : 0);

/** Each section's layout is one function both ways (Io): given the value, it writes it; given none, it reads one. */
function vmIo(io: Io, vm?: VmState): VmState {
  const hostVmId = io.u32(vm?.hostVmId, 'a VM id');
  const at = `VM ${hostVmId}`;
  const [pid, starttime, uid] = [io.u32(vm?.pid, at), io.safe(vm?.starttime, `${at}'s starttime`), io.u32(vm?.uid, at)];
  const owner = io.u32(vm && (vm.owner ?? NO_OWNER), at);
  const flags = io.u8(vm && bits(vm), at);
  if ((flags & ~KNOWN_FLAGS) !== 0) throw new Refused(`${at} has unknown flags 0x${flags.toString(16)}`);
  const has = (flag: number) => (flags & flag) !== 0;
  if (io.u8(vm && 0, at) !== 0) throw new Refused(`${at}'s reserved byte is not 0`);
  const nameBytes = vm?.name == null ? undefined : Buffer.from(vm.name, 'utf8');
  const nameLength = io.u16(vm && (nameBytes?.length ?? 0), at);
  if (nameLength > STATE_LIMITS.maxNameBytes) throw new Refused(`${at}: its name is over ${STATE_LIMITS.maxNameBytes} bytes`);
  if (!has(FLAG.HAS_NAME) && nameLength !== 0) throw new Refused(`${at} has a name length but no name`);
  const endedSamples = io.u32(vm?.endedSamples, at);
  const uuid = has(FLAG.HAS_UUID) ? io.bytes(vm?.uuid ?? undefined, UUID_BYTES, at) : null;
  const raw = has(FLAG.HAS_NAME) ? io.bytes(nameBytes, nameLength, at) : null;
  const name = vm ? vm.name : (raw?.toString('utf8') ?? null);
  if (!vm && raw && !Buffer.from(name!, 'utf8').equals(raw)) throw new Refused(`${at}: its name is not valid UTF-8`);
  const vcpus = io.list(2, vm?.vcpus, MAX_VCPUS, 6, `vCPUs of ${at}`, (v) => ({ tid: io.u32(v?.tid, at), vpkg: io.u16(v?.vpkg, at) }));
  const vpkgs = io.list(2, vm?.vpkgs, MAX_VPKG + 1, 20, `virtual packages of ${at}`, (v) => ({
    energyUj: io.u64(v?.energyUj, at),
    counter: BigInt(io.u32(v && Number(v.counter), at)),
    energyJ: io.f64(v?.energyJ, at),
  }));
  const valuesNs = io.u64(vm?.valuesNs, at);
  return (
    vm ?? {
      hostVmId,
      pid,
      starttime,
      uid,
      owner: owner === NO_OWNER ? null : owner,
      discovered: has(FLAG.DISCOVERED),
      name,
      uuid,
      wholeVmOnly: has(FLAG.WHOLE_VM_ONLY),
      live: has(FLAG.LIVE),
      baseline: has(FLAG.BASELINE),
      valuesNs,
      endedSamples,
      vcpus,
      vpkgs,
    }
  );
}

/** The payload of a `version` record; a section a version before it did not write is read as empty, and an empty one is left out. */
function payloadIo(io: Io, version: number, s?: StateSnapshot): StateSnapshot {
  const L = STATE_LIMITS;
  const nextHostVmId = io.u32(s?.nextHostVmId, 'the next VM id');
  const vms = io.list(4, s?.vms, L.maxVms, 64, 'VMs', (vm) => vmIo(io, vm));
  const at = 'package totals';
  const packages = io.list(4, s?.packages, L.maxPackages, 36, 'packages', (k) => ({
    pkg: io.u32(k?.pkg, at),
    energyUj: io.u64(k?.energyUj, at),
    unattributedUj: io.u64(k?.unattributedUj, at),
    energyJ: io.f64(k?.energyJ, at),
    unattributedJ: io.f64(k?.unattributedJ, at),
  }));
  const knownPids = io.list(4, s?.knownPids, L.maxKnownPids, 12, 'known processes', (k) => ({
    pid: io.u32(k?.pid, 'known processes'),
    starttime: io.safe(k?.starttime, "a known process's starttime"),
  }));
  const t = s?.lastSample;
  const has = io.u8(s && (t === null ? 0 : 1), 'the last sample flag');
  if (has > 1) throw new Refused(`the last sample flag is ${has}, not 0 or 1`);
  const lastSample = has === 0 ? null : sampleIo(io, t ?? undefined);
  const out: StateSnapshot = { nextHostVmId, vms, packages, knownPids, lastSample };
  const d = version >= 2 ? domainsIo(io, s && (s.domains ?? { vms: [], packages: [], counters: [] })) : null;
  if (d !== null && d.vms.length + d.packages.length + d.counters.length > 0) out.domains = d;
  const guest = version >= 3 ? guestCountersIo(io, s && (s.guest ?? [])) : [];
  if (guest.length > 0) out.guest = guest;
  const limits = version >= 4 ? powerLimitsIo(io, s && (s.limits ?? [])) : [];
  if (limits.length > 0) out.limits = limits;
  return s ?? out;
}

type Sample = NonNullable<StateSnapshot['lastSample']>;

function sampleIo(io: Io, t?: Sample): Sample {
  const L = STATE_LIMITS;
  const at = 'the last sample';
  return {
    monotonicNs: io.u64(t?.monotonicNs, at),
    realtimeNs: io.u64(t?.realtimeNs, at),
    packages: io.list(4, t?.packages, L.maxPackages, 12, 'sampled packages', (k) => ({ pkg: io.u32(k?.pkg, at), raw: io.u64(k?.raw, at) })),
    threads: io.list(4, t?.threads, L.maxThreads, 24, 'sampled threads', (th) => ({
      pid: io.u32(th?.pid, at),
      tid: io.u32(th?.tid, at),
      starttime: io.safe(th?.starttime, "a sampled thread's starttime"),
      ticks: io.u64(th?.ticks, at),
    })),
  };
}

function domainIo(io: Io, d: OtherDomain | undefined, what: string): OtherDomain {
  const code = io.u8(d && ENERGY_DOMAINS.indexOf(d), what);
  const domain = ENERGY_DOMAINS[code];
  if (!isOtherDomain(domain)) throw new Refused(`${what} has domain code ${code}, not a RAPL domain besides the package`);
  if (io.u8(d && 0, what) !== 0) throw new Refused(`${what}'s reserved byte is not 0`);
  return domain;
}

/** A package entry's key (u32 pkg | u8 d | u8 0 | u16 0), and what to call the rest of the entry in a refusal. */
function packageKeyIo(io: Io, k: { pkg: number; domain: OtherDomain } | undefined, what: string) {
  const pkg = io.u32(k?.pkg, `a package's other-domain ${what}`);
  const at = `package ${pkg}'s other-domain ${what}`;
  const domain = domainIo(io, k?.domain, at);
  if (io.u16(k && 0, at) !== 0) throw new Refused(`${at}: its reserved field is not 0`);
  return { pkg, domain, at };
}

function domainsIo(io: Io, d?: DomainsState): DomainsState {
  const max = STATE_LIMITS.maxDomainEntries;
  const vms = io.list(4, d?.vms, max, 8, "VMs' other-domain totals", (v) => {
    const hostVmId = io.u32(v?.hostVmId, "a VM's other-domain totals");
    const at = `VM ${hostVmId}'s other-domain totals`;
    const domain = domainIo(io, v?.domain, at);
    return { hostVmId, domain, energyJ: io.list(2, v?.energyJ, MAX_VPKG + 1, 8, `virtual packages of ${at}`, (j) => io.f64(j, at)) };
  });
  const packages = io.list(4, d?.packages, max, 24, "packages' other-domain totals", (k) => {
    const { pkg, domain, at } = packageKeyIo(io, k, 'totals');
    return { pkg, domain, energyJ: io.f64(k?.energyJ, at), unattributedJ: io.f64(k?.unattributedJ, at) };
  });
  const counters = io.list(4, d?.counters, max, 16, 'other-domain counters', (k) => {
    const { pkg, domain, at } = packageKeyIo(io, k, 'counter');
    return { pkg, domain, raw: io.u64(k?.raw, at) };
  });
  return { vms, packages, counters };
}

/** The record's bytes: the snapshot, and what a planned restart hands over. Throws a RangeError naming the rule a value breaks. */
export function encodeState(s: StateSnapshot, handover?: Handover): Buffer {
  const problem = stateProblem(s) ?? (handover ? handoverProblem(handover) : null);
  const w = new Writer(STATE_HEADER_SIZE);
  let stateEnd = 0;
  try {
    if (problem !== null) throw new RangeError(problem);
    payloadIo(w, STATE_FORMAT_VERSION, s);
    stateEnd = w.length;
    if (handover) handoverIo(w, handover);
    const max = STATE_LIMITS.maxPayloadBytes;
    if (w.length - STATE_HEADER_SIZE > max) throw new RangeError(`it takes ${w.length - STATE_HEADER_SIZE} bytes, at most ${max}`);
  } catch (e) {
    // The layout refuses a value out of its field's range or an unknown code, by the field's name.
    throw e instanceof RangeError || e instanceof Refused ? new RangeError(cannot('save state', e.message)) : e;
  }
  const out = w.done();
  STATE_MAGIC.copy(out, 0);
  out.writeUInt32LE(STATE_FORMAT_VERSION, 8);
  out.writeUInt32LE(out.length - STATE_HEADER_SIZE, 12);
  out.writeUInt32LE(zlib.crc32(out.subarray(STATE_HEADER_SIZE)), 16);
  out.writeUInt32LE(out.length - stateEnd, 20);
  return out;
}

/** The record's payload and version once its header and checksum hold, and the length of its hand-over; else why not. */
function openRecord(bytes: Buffer): { version: number; payload: Buffer; handover: number } | { why: string; fix?: string } {
  if (bytes.length < STATE_HEADER_SIZE)
    return { why: `the snapshot is ${bytes.length} bytes, shorter than its ${STATE_HEADER_SIZE}-byte header` };
  if (!bytes.subarray(0, 8).equals(STATE_MAGIC)) return { why: 'it does not start with VMSRSTAT: it is not a vmsr-helper state snapshot' };
  const version = bytes.readUInt32LE(8);
  if (!READABLE_VERSIONS.includes(version))
    return {
      why: `it is format version ${version}, this vmsr-helper reads versions ${READABLE_VERSIONS.slice(0, -1).join(', ')} and ${READABLE_VERSIONS.at(-1)}`,
      fix: `run the vmsr-helper that wrote it, or ${FIX}`,
    };
  const length = bytes.readUInt32LE(12);
  if (length > STATE_LIMITS.maxPayloadBytes)
    return { why: `its header announces ${length} bytes, at most ${STATE_LIMITS.maxPayloadBytes}` };
  const have = bytes.length - STATE_HEADER_SIZE;
  if (have < length) return { why: `it is cut off: ${have} of the ${length} bytes its header announces` };
  if (have > length) return { why: `${have - length} bytes follow the ${length} its header announces` };
  const handover = bytes.readUInt32LE(20);
  if (version < 4 && handover !== 0) return { why: 'its reserved header field is not 0' };
  if (handover > length) return { why: `its hand-over of ${handover} bytes is longer than its ${length}-byte payload` };
  const payload = bytes.subarray(STATE_HEADER_SIZE);
  const [sum, said] = [zlib.crc32(payload), bytes.readUInt32LE(16)];
  if (sum !== said)
    return { why: `its checksum does not match (CRC-32 ${sum.toString(16)}, header says ${said.toString(16)}): it was damaged` };
  return { version, payload, handover };
}

/** `read` over `bytes`, every failure a refusal (a check that threw instead: a bug, named as such). */
function readChecked<T>(bytes: Buffer, what: string, fix: string, read: (r: Reader) => string | T): Result<T> {
  const refuse = (why: string) => fail(cannot(what, why, fix));
  try {
    const r = new Reader(bytes);
    const v = read(r);
    if (typeof v === 'string') return refuse(v);
    if (r.left !== 0) return refuse(`${r.left} bytes follow the last entry`);
    return ok(v);
  } catch (e) {
    if (e instanceof Refused) return refuse(e.message);
    return refuse(`reading it failed unexpectedly (${String(e)}); please report it`);
  }
}

/** The snapshot in the record `bytes`, or "cannot restore state: why; fix". */
export function decodeState(bytes: Buffer): Result<StateSnapshot> {
  const rec = openRecord(bytes);
  if ('why' in rec) return fail(cannot('restore state', rec.why, rec.fix ?? FIX));
  const state = rec.payload.subarray(0, rec.payload.length - rec.handover);
  return readChecked(state, 'restore state', FIX, (r) => {
    const s = payloadIo(r, rec.version);
    return stateProblem(s) ?? s;
  });
}

const HANDOVER_FIX = 'the connections it lists are closed; the restart was made by another vmsr-helper or the record was damaged';

/** What the record hands over (null: a checkpoint), or "cannot use the handover record: ..."; `nowNs` refuses another boot's. */
export function decodeHandover(bytes: Buffer, nowNs: bigint): Result<Handover | null> {
  const rec = openRecord(bytes);
  if ('why' in rec) return fail(cannot('use the handover record', rec.why, HANDOVER_FIX));
  if (rec.handover === 0) return ok(null);
  return readChecked(rec.payload.subarray(rec.payload.length - rec.handover), 'use the handover record', HANDOVER_FIX, (r) => {
    const h = handoverIo(r);
    if (h.writtenNs > nowNs) return 'it was written after now on the monotonic clock (another boot)';
    return handoverProblem(h) ?? h;
  });
}
