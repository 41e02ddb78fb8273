/** What GuestEnergy takes, and what it shows of a VM. */
import type { Logger } from '../../logging/logger.js';
import type { PeerCredentials } from '../../os/libc/sockets.js';
import type { GuestVm } from '../../guest-energy/guest-counter.js';
import type { HostInfo } from '../../model/host.js';
import type { HeldFds } from './thread-reads.js';
import type { ExitProbeKind } from './thread-exits.js';
import type { KeptFdLedger } from '../../os/proc-tasks.js';
import type { ShareOwner } from '../../budget/uid-share.js';
import type { GuestEnergyMode } from '../../guest-energy/modes.js';

/** What the helper knows of a VM, for its guest counters. */
export interface GuestVmView extends GuestVm {
  vmId: number;
  starttime: number;
  /** Its attributed energy now, all virtual packages (J). */
  exactJ: number;
  /** The same per virtual package (J), for the debug window line. */
  vpkgJ?: readonly number[];
}

export interface GuestEnergyOptions {
  procRoot: string;
  host: HostInfo;
  /** Joules per unit of the guest's MSR_PKG_ENERGY_STATUS (the unit QEMU passes to the guest). */
  unitJ: number;
  /** The live VM whose process is `pid`, if the helper knows one. */
  find(pid: number): GuestVmView | undefined;
  /** find() for each of `pids` at once (after each sample: sampled()); default: none kept, find() at each window's end. */
  findAll?(pids: ReadonlySet<number>): ReadonlyMap<number, GuestVmView>;
  log: Logger;
  clock: () => bigint;
  maxThreads: number;
  /** The stat fds the sampler keeps open (ProcTaskReader.heldFds); default: none, every stat opened by path. */
  heldFds?: HeldFds;
  /** QEMU's version of a process ("10.0.2"), or null; default: read from its executable. */
  versionOf?: (pid: number) => Promise<string | null>;
  /** The VMs' fd shares, for the pidfds that tell thread exits (thread-exits.ts); default: not counted. */
  ledger?: KeptFdLedger;
  /** How thread exits are told; default: pidfds where the kernel has them (exitProbeKind). */
  exitProbe?: ExitProbeKind;
  /** Who holds a peer's place, for the share rule (the connection's credentials when it asks; by pid at a restore); default: its uid, preferred. */
  owner?: (pid: number, peer?: PeerCredentials) => ShareOwner | null;
  /** Processes remembered at once (GuestPeers); default: as many as discovery tracks. */
  maxPeers?: number;
}

/** What an operator sees of a VM's guest energy (stats, LIST, the exporter). */
export interface GuestEnergyView {
  mode: GuestEnergyMode;
  /** Energy QEMU was given to credit the guest since exact began (J). */
  guestJ: number;
  /** Energy the helper attributed to the VM over the same windows (J). */
  exactJ: number;
  windows: number;
  /** Windows QEMU's arithmetic turned into garbage (garbage-shadow.ts), and the energy it credited otherwise than owed (J). */
  garbageWindows: number;
  garbageJ: number;
  /** Windows answered a zero delta for a possible thread exit, and those answered non-zero with an exit seen right after. */
  exitWindows: number;
  lateExits: number;
}
