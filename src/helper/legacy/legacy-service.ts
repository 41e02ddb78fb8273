/** A legacy request -> its 8-byte reply, as the reference helper but stricter: tid checked first, offline cpu 0 unopened, failed read 0. */
import { readOnlineCpus } from '../../msr/topology.js';
import { type MsrDevice, MsrReadError } from '../../msr/device.js';
import { LEGACY_ALLOWED_MSRS, MSR_PKG_ENERGY_STATUS } from '../../msr/registers.js';
import type { Vendor } from '../../model/host.js';
import { legacyPlan, synthValue, type AmdSynthConfig, type LegacyPlan } from '../../msr/legacy-registers.js';
import { LEGACY_REPLY_SIZE, type LegacyRequest } from '../../protocol/legacy.js';
import { TidVerdicts } from './tid-verdicts.js';
import type { Logger } from '../../logging/logger.js';
import { LogLimiter } from '../../logging/log-limiter.js';
import type { PeerCredentials } from '../../os/libc/sockets.js';

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

interface LegacyServiceOptions {
  device: MsrDevice;
  vendor: Vendor;
  procRoot: string;
  cpus: OnlineCpus;
  amd: AmdSynthConfig;
  logger: Logger;
  /** Where to count requests by result (the daemon shares it with the v2 service). */
  counters?: LegacyCounters;
  /** Why no MSR can be read, when none can (powercap or synthetic source): every request gets 0 and a warning why. */
  noMsrs?: string;
  /** --guest-energy exact after a restart: MSR_PKG_ENERGY_STATUS answered 0 (a zero delta to QEMU) until setEnergyStatus. */
  holdEnergyStatus?: boolean;
}

/** Legacy requests by result (HOST_UPDATE, the exporter): numbers, as a bigint allocates (exact 1400 years at 200 000/s). */
export function newLegacyCounters() {
  return { ok: 0, refused: 0, failed: 0 };
}
export type LegacyCounters = ReturnType<typeof newLegacyCounters>;

/** MSR_PKG_ENERGY_STATUS answered by someone else (--guest-energy exact: GuestEnergy). */
export interface EnergyStatusHook {
  /** The value for a peer (the connection's process: its pid and start time name it) and cpu, or undefined to leave the request raw. */
  answer(peer: PeerCredentials, cpu: number): bigint | undefined;
  /** Called once the replies of a chunk were sent: work the replies need not wait for. */
  afterReplies(): void;
}

/** Peers held at most (a restart hands over at most --max-connections connections). */
const MAX_HELD_PEERS = 65_536;

export class LegacyService {
  private readonly plans = new Map<number, LegacyPlan>();
  private energyStatus: EnergyStatusHook | undefined;
  /** Peers answered 0 for MSR_PKG_ENERGY_STATUS before the hook was set, and the time (CLOCK_MONOTONIC ns) of their last such request. */
  private readonly held = new Map<number, bigint>();
  /** Online CPUs whose device could not be opened for want of privilege, each said once (at most the host's CPUs: offline ones never get here). */
  private readonly unopenable = new Set<number>();
  readonly counters: LegacyCounters;
  readonly limiter: LogLimiter;

  constructor(private readonly o: LegacyServiceOptions) {
    this.counters = o.counters ?? newLegacyCounters();
    this.limiter = new LogLimiter(o.logger);
    for (const msr of LEGACY_ALLOWED_MSRS) {
      const plan = legacyPlan(o.vendor, msr);
      if (plan !== null) this.plans.set(msr, plan);
    }
  }

  /** Installs the guest-energy hook (once the v2 service is up); returns the peers held meanwhile. */
  setEnergyStatus(hook: EnergyStatusHook): ReadonlyMap<number, bigint> {
    this.energyStatus = hook;
    return this.held;
  }

  afterReplies(): void {
    this.energyStatus?.afterReplies();
  }

  verdictsFor(peerPid: number): TidVerdicts {
    return new TidVerdicts(this.o.procRoot, peerPid);
  }

  /** Writes the 8-byte reply to `req` at out[offset]; false: close without a reply (not an allowed MSR, as the reference helper). */
  answer(peer: PeerCredentials, req: LegacyRequest, verdicts: TidVerdicts, out: Buffer, offset: number): boolean {
    const c = this.counters;
    const peerPid = peer.pid;
    const plan = this.plans.get(req.msr);
    // Refused: MSR not allowed (closed), tid not the peer's, cpu not online (0).
    if (plan === undefined) {
      c.refused++;
      this.limiter.warn('disallowed MSR', { peer: peerPid, msr: req.msr }, 'requested MSR is not allowed; closing the connection');
      return false;
    }
    if (!verdicts.belongs(req.tid)) {
      c.refused++;
      this.o.logger.debug({ peer: peerPid, tid: req.tid }, 'requested tid is not a thread of the peer; replying 0');
      return zero(out, offset);
    }
    if (req.cpu > 0xffff || !this.o.cpus.has(req.cpu)) {
      c.refused++;
      this.o.logger.debug({ peer: peerPid, cpu: req.cpu }, 'requested cpu is not online; replying 0');
      return zero(out, offset);
    }
    if (this.o.noMsrs !== undefined) {
      c.failed++;
      this.limiter.warn(
        'no MSR',
        { peer: peerPid, cpu: req.cpu, msr: req.msr, why: this.o.noMsrs },
        `QEMU asked for an MSR, but ${this.o.noMsrs}; replying 0 (load msr and use --energy-source msr)`,
      );
      return zero(out, offset);
    }
    if (req.msr === MSR_PKG_ENERGY_STATUS && this.energyStatus === undefined && this.o.holdEnergyStatus === true) {
      if (this.held.size < MAX_HELD_PEERS || this.held.has(peerPid)) this.held.set(peerPid, process.hrtime.bigint());
      c.ok++;
      return zero(out, offset);
    }
    const own = req.msr === MSR_PKG_ENERGY_STATUS ? this.energyStatus?.answer(peer, req.cpu) : undefined;
    try {
      if (own !== undefined) out.writeBigUInt64LE(own, offset);
      else if (plan.kind === 'read') this.o.device.readInto(req.cpu, plan.msr, out, offset);
      else out.writeBigUInt64LE(BigInt.asUintN(64, synthValue(plan.field, this.o.device.read(req.cpu, plan.unitMsr), this.o.amd)), offset);
      c.ok++;
      return true;
    } catch (e) {
      if (!(e instanceof MsrReadError)) throw e;
      c.failed++;
      this.o.cpus.invalidate();
      this.saidUnopenable(e);
      this.limiter.warn('failed MSR read', { peer: peerPid, cpu: req.cpu, msr: req.msr, err: e.message }, 'MSR read failed; replying 0');
      return zero(out, offset);
    }
  }

  /** A CPU brought online after the start: its device is opened only by the next start (no privilege left). Said once per CPU. */
  private saidUnopenable(e: MsrReadError): void {
    if ((e.code !== 'EACCES' && e.code !== 'EPERM') || this.o.device.isOpen(e.cpu) || this.unopenable.has(e.cpu)) return;
    this.unopenable.add(e.cpu);
    this.o.logger.warn(
      { cpu: e.cpu, err: e.code },
      `cannot open the MSR device of CPU ${e.cpu}: it came online after the start, and the helper holds no privilege to open it since; its registers read as 0; fix: start the helper again (systemctl restart qemu-vmsr-helper, or stop and start it: a restart in place with SIGHUP opens nothing)`,
    );
  }
}

function zero(out: Buffer, offset: number): true {
  out.fill(0, offset, offset + LEGACY_REPLY_SIZE);
  return true;
}
