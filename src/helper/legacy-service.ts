/**
 * One legacy request -> the 8-byte value to reply, as the reference helper would, but stricter:
 * the tid is checked before anything is read, an offline or nonexistent cpu gets 0 without opening
 * anything, and any read failure is 0. Everything here runs synchronously on the main thread, whose
 * capabilities are the ones that were dropped to CAP_SYS_RAWIO (see privileges.ts).
 */
import { readOnlineCpus } from '../msr/topology.js';
import type { MsrDevice } from '../msr/device.js';
import { MsrReadError } from '../msr/device.js';
import type { Vendor } from '../ratio/types.js';
import { legacyPlan, synthValue, type AmdSynthConfig } from '../msr/legacy-registers.js';
import type { LegacyRequest } from '../protocol/legacy.js';
import { tidBelongsTo } from '../os/peer.js';
import type { Logger } from './logger.js';

/** The set of online CPUs, re-read from sysfs (at most once a second) when asked about a new one. */
export class OnlineCpus {
  private online: Set<number>;
  private lastRefresh = 0;

  constructor(
    private readonly sysRoot: string,
    initial: readonly number[],
    private readonly refreshMs = 1000,
    private readonly now: () => number = () => Date.now(),
  ) {
    this.online = new Set(initial);
    this.lastRefresh = this.now();
  }

  has(cpu: number): boolean {
    if (this.online.has(cpu)) return true;
    const t = this.now();
    if (t - this.lastRefresh < this.refreshMs) return false;
    this.lastRefresh = t;
    try {
      this.online = new Set(readOnlineCpus(this.sysRoot));
    } catch {
      /* keep the last known set */
    }
    return this.online.has(cpu);
  }

  /** After a read failure: the next question about an unknown cpu may re-read sysfs at once. */
  invalidate(): void {
    this.lastRefresh = 0;
  }
}

export interface LegacyServiceOptions {
  device: MsrDevice;
  vendor: Vendor;
  procRoot: string;
  cpus: OnlineCpus;
  amd: AmdSynthConfig;
  logger: Logger;
}

export type LegacyOutcome =
  | { kind: 'reply'; value: bigint }
  /** Not an allowed MSR: the connection closes without a reply, as in the reference helper. */
  | { kind: 'close' };

export class LegacyService {
  constructor(private readonly o: LegacyServiceOptions) {}

  handle(peerPid: number, req: LegacyRequest): LegacyOutcome {
    const plan = legacyPlan(this.o.vendor, req.msr);
    if (plan === null) {
      this.o.logger.warn({ peer: peerPid, msr: req.msr }, 'requested MSR is not allowed; closing the connection');
      return { kind: 'close' };
    }
    if (!tidBelongsTo(this.o.procRoot, peerPid, req.tid)) {
      this.o.logger.debug({ peer: peerPid, tid: req.tid }, 'requested tid is not a thread of the peer; replying 0');
      return { kind: 'reply', value: 0n };
    }
    if (req.cpu > 0xffff || !this.o.cpus.has(req.cpu)) {
      this.o.logger.debug({ peer: peerPid, cpu: req.cpu }, 'requested cpu is not online; replying 0');
      return { kind: 'reply', value: 0n };
    }
    try {
      if (plan.kind === 'read') return { kind: 'reply', value: this.o.device.read(req.cpu, plan.msr) };
      const unit = this.o.device.read(req.cpu, plan.unitMsr);
      return { kind: 'reply', value: synthValue(plan.field, unit, this.o.amd) };
    } catch (e) {
      if (!(e instanceof MsrReadError)) throw e;
      this.o.cpus.invalidate();
      this.o.logger.warn({ peer: peerPid, cpu: req.cpu, msr: req.msr, err: e.message }, 'MSR read failed; replying 0');
      return { kind: 'reply', value: 0n };
    }
  }
}
