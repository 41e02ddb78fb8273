/** What a V2Client gives its caller: the errors it throws, its replies and updates. */
import {
  type T,
  errorCodeName,
  typeName,
  type HostValues,
  type VmDomainValues,
  type VmEntry,
  type VpkgValue,
} from '../protocol/v2/codec.js';
import type { HelperMessage } from '../protocol/v2/messages.js';
import { formatUuid } from '../common/uuid.js';

export interface SubscribeOptions {
  /** Ask for each other RAPL domain's energy (Update.domains); a helper that refuses the flag (ERROR 1) is asked without. */
  domains?: boolean;
}

/** An ERROR frame from the helper. */
export class V2Error extends Error {
  constructor(
    readonly code: number,
    readonly requestType: number,
    readonly helperMessage: string,
  ) {
    super(`${typeName(requestType)}: ${errorCodeName(code)} (error ${code}): ${helperMessage}`);
    this.name = 'V2Error';
  }
}

/** The helper could not be reached, or the connection broke. */
export class V2ConnectionError extends Error {
  constructor(
    message: string,
    readonly code?: string,
  ) {
    super(message);
    this.name = 'V2ConnectionError';
  }
}

/** REGISTERED: the VM's id, its virtual packages, and the MSR_RAPL_POWER_UNIT a guest should see (powerUnit). */
export type Registered = Omit<Extract<HelperMessage, { type: typeof T.REGISTERED }>, 'type'>;

/** One virtual package's values (VALUE), as the protocol decodes them. */
export type Value = Omit<Extract<HelperMessage, { type: typeof T.VALUE }>, 'type'>;

export interface Update {
  vmId: number;
  tNs: bigint;
  /** Index = vpkg. */
  vpkgs: VpkgValue[];
  ended: boolean;
  /**
   * Asked for with `domains`: per other RAPL domain the host reads (ENERGY_DOMAINS order), µJ per vpkg;
   * empty when the host reads only the package. Absent when not asked for, or the helper predates it.
   */
  domains?: VmDomainValues[];
}

/** One VM as LIST shows it (docs/protocol-v2.md "VM_LIST"). */
export interface VmInfo {
  /** Host-wide id: OBSERVE takes it; for a registered VM it is also the registrant's vm_id. */
  hostVmId: number;
  pid: number;
  /** Owner of the VM's process. */
  uid: number;
  /** Field 22 of /proc/<pid>/stat: (pid, starttime) names the process across pid reuse. */
  starttime: bigint;
  name: string | null;
  /** Lowercase 8-4-4-4-12 form. */
  uuid: string | null;
  source: 'registered' | 'discovered';
  nvpkg: number;
  ended: boolean;
  /** The vCPU threads could not be told apart: vpkg 0 holds the whole VM's energy. */
  wholeVmOnly: boolean;
  /** Not every thread of its process is sampled (over its fd share, or out of fds): its energy is a lower bound. Absent = false. */
  notWhole?: boolean;
  /** Its guest reads its own VM's energy (the helper's --guest-energy exact: LIST's GUEST_EXACT). Absent = false. */
  guestExact?: boolean;
}

/** An OBSERVE update: the same values as a SUBSCRIBE update, named by host-wide id. */
export type VmUpdate = Omit<Update, 'vmId'> & { hostVmId: number };

/**
 * A HOST_UPDATE: each package's energy and, from a helper that sends it, the part attributed to no VM
 * (else null); tNs is the sample's CLOCK_MONOTONIC (age = now - tNs on this host); vmsChanged: a VM
 * appeared, ended or was dropped since the previous sample, LIST again.
 */
export type HostUpdate = HostValues;

export function toVmInfo(e: VmEntry): VmInfo {
  return {
    hostVmId: e.hostVmId,
    pid: e.pid,
    uid: e.uid,
    starttime: e.starttime,
    name: e.name,
    uuid: e.uuid === null ? null : formatUuid(e.uuid),
    source: e.discovered ? 'discovered' : 'registered',
    nvpkg: e.nvpkg,
    ended: e.ended,
    wholeVmOnly: e.wholeVmOnly,
    notWhole: e.notWhole === true,
    guestExact: e.guestExact === true,
  };
}
