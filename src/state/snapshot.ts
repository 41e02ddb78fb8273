/** What the daemon carries across a restart or a crash, and the bounds it keeps; a planned restart's Handover besides. */
import type { GuestCounterState } from '../guest-energy/guest-counter.js';
import type { EnergyDomain, OtherDomain } from '../model/domains.js';
import { MAX_VMS } from '../model/vm.js';
import type { VcpuSpec } from '../model/vcpus.js';

/** Each limit a snapshot must keep, checked on encode and on decode (docs/daemon.md "Restart state"). */
export const STATE_LIMITS = {
  maxPayloadBytes: 64 * 1024 * 1024,
  maxVms: MAX_VMS,
  /** A VM's name, UTF-8 bytes. */
  maxNameBytes: 1024,
  maxPackages: 4096,
  maxKnownPids: 1_000_000,
  maxThreads: 4_000_000,
  /** Other-domain entries of each kind: per VM, package or counter and each of the 4 other domains. */
  maxDomainEntries: 4 * MAX_VMS,
  maxGuestCounters: MAX_VMS,
  maxPowerLimits: 4096,
} as const;

interface VpkgTotals {
  /** The ratio engine's accumulator A(v,g), joules (float64): what the next intervals add to. */
  energyJ: number;
  /** Energy attributed to this virtual package since the VM was registered, µJ: floor(energyJ * 1e6). */
  energyUj: bigint;
  /** What the guest reads in MSR_PKG_ENERGY_STATUS: floor(energy / guest ESU) mod 2^32. */
  counter: bigint;
}

export interface VmState {
  /** Host-wide id (OBSERVE, LIST; a registered VM's vm_id). */
  hostVmId: number;
  pid: number;
  /** Field 22 of /proc/<pid>/stat: (pid, starttime) names the process. */
  starttime: number;
  /** Owner of /proc/<pid>. */
  uid: number;
  /** The connection that registered it; null when only discovered. */
  owner: number | null;
  discovered: boolean;
  name: string | null;
  uuid: Buffer | null;
  /** The vCPU threads could not be told apart: vpkg 0 holds the whole VM's energy. */
  wholeVmOnly: boolean;
  /** False once ended (process gone, pid reused, or unregistered): its totals are frozen. */
  live: boolean;
  /** Live and the last sample counted for it (its baseline or an interval): the next sample closes an interval. */
  baseline: boolean;
  /** Sample time (monotonic ns) of its totals; 0 before its first interval. */
  valuesNs: bigint;
  endedSamples: number;
  vcpus: VcpuSpec[];
  /** Index = virtual package. */
  vpkgs: VpkgTotals[];
}

interface HostPackageState {
  pkg: number;
  /** Since sampling started, in J as they accumulate, and in µJ; unattributed: the part of no VM. */
  energyJ: number;
  unattributedJ: number;
  energyUj: bigint;
  unattributedUj: bigint;
}

export interface SampledThread {
  pid: number;
  tid: number;
  starttime: number;
  ticks: bigint;
}

interface SampleState {
  monotonicNs: bigint;
  /** CLOCK_REALTIME then, ns: tells the gap where the monotonic clock does not go on. */
  realtimeNs: bigint;
  packages: { pkg: number; raw: bigint }[];
  /** Each thread of each VM that had its baseline, with its cumulative utime+stime ticks. */
  threads: SampledThread[];
}

/** The RAPL domains other than the package (format version 2 on). */
export interface DomainsState {
  /** Per VM (by host VM id) and domain: A(v,g) of that domain, joules, index = virtual package. */
  vms: { hostVmId: number; domain: OtherDomain; energyJ: number[] }[];
  /** Per package and domain: the host totals since sampling started, joules. */
  packages: { pkg: number; domain: OtherDomain; energyJ: number; unattributedJ: number }[];
  /** Per package and domain: its counter as last read; empty without a last sample. */
  counters: { pkg: number; domain: OtherDomain; raw: bigint }[];
}

export interface StateSnapshot {
  nextHostVmId: number;
  vms: VmState[];
  packages: HostPackageState[];
  /** Processes discovery has looked at (alive at the last scan). */
  knownPids: { pid: number; starttime: number }[];
  lastSample: SampleState | null;
  /** Each absent when empty (and before the version that added it); guest: --guest-energy exact. */
  domains?: DomainsState;
  guest?: GuestCounterState[];
  limits?: PowerLimitState[];
}

/** A VM's power limit and each quota file it wrote, with the bytes before (docs/power-limits.md "Restarts and crashes"). */
export interface PowerLimitState {
  vmId: number;
  pid: number;
  /** One record per VM and domain. */
  domain: EnergyDomain;
  limitW: number;
  limitedS: number;
  /** The CPUs the loop last gave the VM; null while it sets no quota (or on a VM's records after its first). */
  quotaCpus: number | null;
  /** Set by the limits file (--limits), not over v2: the next reading of the file replaces it. */
  fromFile: boolean;
  groups: HeldGroupState[];
}

/** A quota file: its group (a key to match the group found again, never opened as it is), its bytes before, the helper's last write. */
export interface HeldGroupState {
  dir: string;
  saved: string;
  written: string | null;
  /** The helper made the group and moved the VM's threads into it. */
  made: boolean;
}

export interface HandedConnection {
  /** st_ino of its socket: pairs the record with the fd handed over. */
  ino: bigint;
  /** 'undecided': fewer than 4 bytes read when reading stopped. */
  kind: 'legacy' | 'undecided';
  /** Bytes read and not answered. */
  pending: Buffer;
}

/** What a planned restart carries besides the state (absent from a checkpoint). */
export interface Handover {
  /** CLOCK_MONOTONIC when written: a record from after now is from another boot. */
  writtenNs: bigint;
  legacy: { ok: number; refused: number; failed: number };
  connections: HandedConnection[];
}
