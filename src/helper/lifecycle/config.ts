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
  /** --busy-poll-max-us: the busy poll's longest window after replies, µs (0: never polls). */
  busyPollMaxUs: number;
  /** --guest-energy exact: MSR_PKG_ENERGY_STATUS answered 0 until the v2 service starts (a raw value would pair with a guest counter). */
  holdEnergyStatus?: boolean;
  socketMode: number;
  socketGid?: number;
}
