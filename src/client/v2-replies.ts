/** What a V2Client gives its caller: the errors it throws, its replies and updates. */
import { type T, errorCodeName, typeName, type HostValues, type VmEntry } from '../protocol/v2/codec.js';
import type { HelperMessage } from '../protocol/v2/messages.js';
import { formatUuid } from '../common/uuid.js';

export interface SubscribeOptions {
  /** Ask for each other RAPL domain's energy (Update.domains); a helper that refuses the flag (ERROR 1) is asked without. */
  domains?: boolean;
}

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

export type Value = Omit<Extract<HelperMessage, { type: typeof T.VALUE }>, 'type'>;

/** An UPDATE; `domains` (SubscribeOptions.domains): µJ per vpkg of each other domain the host reads, ENERGY_DOMAINS order (empty: package only; absent: older helper). */
export type Update = Omit<Extract<HelperMessage, { type: typeof T.UPDATE }>, 'type'>;

/** One VM as LIST shows it: hostVmId (OBSERVE's id) is its registrant's vm_id; (pid, starttime) names it across pid reuse; flags as VM_ENTRY_FLAGS. */
export type VmInfo = Omit<VmEntry, 'uuid' | 'discovered'> & {
  /** Lowercase 8-4-4-4-12 form. */
  uuid: string | null;
  source: 'registered' | 'discovered';
};

/** An OBSERVE update: the same values as a SUBSCRIBE update, named by host-wide id. */
export type VmUpdate = Omit<Update, 'vmId'> & { hostVmId: number };

/** A HOST_UPDATE: per package the energy and the part no VM has (null: older helper); tNs: CLOCK_MONOTONIC (age = now - tNs here); vmsChanged: a VM came or went, LIST again. */
export type HostUpdate = HostValues;

export function toVmInfo({ uuid, discovered, ...e }: VmEntry): VmInfo {
  return { ...e, uuid: uuid === null ? null : formatUuid(uuid), source: discovered ? 'discovered' : 'registered' };
}
