/**
 * The daemon's configuration and its plug-in contract, in a file of their own: the command line
 * (cli/commands/daemon.ts) makes a DaemonConfig, the start-up (startup.ts, privileged-start.ts) and
 * the daemon (daemon.ts) read it, and plug-ins (assemble.ts) receive a DaemonContext.
 */
import type { MsrDevice } from '../../msr/device.js';
import type { HostPaths } from '../../msr/host-paths.js';
import type { AmdSynthConfig } from '../../msr/legacy-registers.js';
import type { EnergyStatusHook, HeldPeers } from '../legacy/legacy-service.js';
import type { HostCpu, Vendor } from '../../ratio/types.js';
import type { Logger, LogLevel } from '../../logging/logger.js';
import type { FdBudget } from '../../os/fd-budget.js';
import type { V2Handler } from '../server/server.js';
import type { HealthSource } from '../v2/service.js';
import type { VendorChoice } from './startup-checks.js';
import type { StateSnapshot } from '../../state/snapshot.js';
import type { EnergySourceChoice, EnergySourceKind } from '../../energy/kinds.js';

export interface DaemonConfig {
  socketPath: string;
  /** -k was given (an error together with socket activation). */
  socketPathGiven: boolean;
  pidfile: string;
  /** -f was given: the pidfile is written even without -d. */
  pidfileGiven: boolean;
  daemonize: boolean;
  uid?: number;
  gid?: number;
  logLevel: LogLevel;
  /** -T patterns: areas (glob, '*' wildcard) logged at debug level. */
  traceAreas: string[];
  hostPaths: HostPaths;
  vendor: VendorChoice;
  /** --energy-source: a kind, or auto (energy/choose.ts), resolved by the start-up's checks. */
  energySource: EnergySourceChoice;
  amd: AmdSynthConfig;
  /** --max-connections (lowered at start-up when the fd limit cannot hold it). */
  maxConnections: number;
  /** --frame-timeout: how long a frame or request may stay incomplete, ms. */
  frameTimeoutMs: number;
  /**
   * --guest-energy exact: until the v2 plug-in answers MSR_PKG_ENERGY_STATUS, QEMUs of handed-over
   * connections get 0 for it (a raw value would pair with a guest counter in QEMU's window).
   */
  holdEnergyStatus?: boolean;
  /** --socket-mode: permission bits of the socket file (default 0600). */
  socketMode: number;
  /** --socket-group: group of the socket file. */
  socketGid?: number;
}

export type ShutdownHook = () => void | Promise<void>;

/** A plug-in's part in a restart (docs/daemon.md "Restarts"; lifecycle/restart.ts runs them). */
export interface RestartParticipant {
  /** The restart begins: what cannot be handed over is told (v2: each client gets ERROR RESTARTING). */
  begin(): void;
  /** Everything begin() told is sent (the restart waits for it, bounded). */
  readonly drained: boolean;
  /** The live state to hand over, taken now, between samples; throws when it cannot be. */
  snapshot(): StateSnapshot;
  /** The restart was called off (the exec failed): go on as before. */
  abort(): void;
}

/** What a plugin gets at start-up: after the checks, MSR opens, listening socket, pidfile and privilege drop, once the legacy requests are served. */
export interface DaemonContext {
  config: DaemonConfig;
  vendor: Vendor;
  cpus: HostCpu[];
  /** The shared MSR fds (opened as root; none unless energySource is msr); read them only on the main thread. */
  device: MsrDevice;
  /** The energy source the start-up chose (--energy-source, auto resolved). */
  energySource: EnergySourceKind;
  /** The fd of a powercap energy_uj file opened as root by the start-up, when it did (energySource powercap). */
  powercapFd(path: string): number | undefined;
  logger: Logger;
  /** The fd budget: whether a VM of so many threads still fits (REGISTER, discovery). */
  fds: FdBudget;
  /** A file the start-up created for writing before the privilege drop (a plug-in's --record), when it did. */
  openedFile(path: string): number | undefined;
  /** A logger for a named area, at debug level when -T matches it. */
  area(name: string): Logger;
  onShutdown(hook: ShutdownHook): void;
  /**
   * Runs once the daemon serves. A hook may return a promise of the start-up work it began (a first
   * scan): the start-up memory settle waits for it (at most STARTUP_SETTLE_WAIT_MS, daemon.ts).
   */
  onReady(hook: () => void | Promise<void>): void;
  /** Legacy requests by result and open connections, for the v2 service's HOST_UPDATE. */
  health: HealthSource;
  /** The live state the previous process handed over (a restart), read and checked; absent at a fresh start. */
  restored?: StateSnapshot;
  /** This start follows a restart: files plug-ins write (--record) go on where the last process stopped. */
  restarted: boolean;
  /** Takes part in restarts: the state is taken from the first participant. */
  onRestart(p: RestartParticipant): void;
  /**
   * Answers QEMU's MSR_PKG_ENERGY_STATUS requests through `hook` from now on (--guest-energy exact);
   * returns the peers answered 0 while the hook was not set (holdEnergyStatus), with their last request's time.
   */
  answerEnergyStatus(hook: EnergyStatusHook): HeldPeers;
}

export interface DaemonPlugin {
  name: string;
  setup(ctx: DaemonContext): void | { v2Handler?: V2Handler } | Promise<void | { v2Handler?: V2Handler }>;
}

/**
 * A plug-in whose module is loaded when it is set up, that is once the daemon serves (daemon.ts): QEMU's
 * replies do not wait for its modules to load (docs/daemon.md "Where the time goes").
 */
export function loadedAtSetup(name: string, load: () => Promise<DaemonPlugin>): DaemonPlugin {
  return { name, setup: async (ctx) => (await load()).setup(ctx) };
}
