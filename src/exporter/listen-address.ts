import { cannot } from '../common/errors.js';
/**
 * --listen HOST:PORT. Loopback by default: the metrics tell who runs which VM and how hard, so
 * exposing them beyond the host is the operator's explicit choice.
 */

/**
 * 8677 spells VMSR on a phone keypad. The Prometheus project's default-port list (9100-9999) has been
 * fully allocated since 2023, so any number there already belongs to another exporter that may run on
 * the same host; 8677 lies outside it and is not in /etc/services (netbase's list of well-known ports).
 */
export const DEFAULT_EXPORTER_PORT = 8677;
export const DEFAULT_LISTEN = `127.0.0.1:${DEFAULT_EXPORTER_PORT}`;

export interface ListenAddress {
  host: string;
  port: number;
}

/** "127.0.0.1:8677", "[::1]:8677", "0.0.0.0:8677"; port 0 picks a free one (tests). */
export function parseListenAddress(text: string): ListenAddress {
  const m = /^\[([0-9a-fA-F:.]+)\]:(\d{1,5})$/.exec(text) ?? /^([^:\s[\]]+):(\d{1,5})$/.exec(text);
  const fix = `use HOST:PORT, e.g. --listen ${DEFAULT_LISTEN} or --listen [::1]:${DEFAULT_EXPORTER_PORT}`;
  if (!m) throw new Error(cannot(`use --listen ${JSON.stringify(text)}`, `not HOST:PORT`, fix));
  const port = Number(m[2]);
  if (port > 65535) throw new Error(cannot(`use --listen ${JSON.stringify(text)}`, `port ${port} is over 65535`, fix));
  return { host: m[1]!, port };
}
