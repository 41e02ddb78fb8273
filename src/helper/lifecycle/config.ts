/**
 * The daemon's configuration, in a file of its own: the command line (cli/commands/start-daemon.ts) makes a
 * DaemonConfig, the start-up (startup.ts, privileged-start.ts, phases.ts) and the daemon (daemon.ts)
 * read it.
 */
import type { HostPaths } from '../../msr/host-paths.js';
import type { AmdSynthConfig } from '../../msr/legacy-registers.js';
import type { LogLevel } from '../../logging/logger.js';
import type { VendorChoice } from './startup-checks.js';
import type { EnergySourceChoice } from '../../energy/kinds.js';

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
   * --guest-energy exact: until the startV2 phase answers MSR_PKG_ENERGY_STATUS, QEMUs of handed-over
   * connections get 0 for it (a raw value would pair with a guest counter in QEMU's window).
   */
  holdEnergyStatus?: boolean;
  /** --socket-mode: permission bits of the socket file (default 0600). */
  socketMode: number;
  /** --socket-group: group of the socket file. */
  socketGid?: number;
}
