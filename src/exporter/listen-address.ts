import { cannotError } from '../common/errors.js';
/**
 * --listen [HOST]:PORT as Go exporters' --web.listen-address: "127.0.0.1:8677", "[::1]:8677", "host.example:8677", or ":8677"
 * (every address). Loopback by default: the metrics tell who runs which VM how hard; beyond the host is the operator's choice.
 */

/** 8677 spells VMSR on a phone keypad; it is outside the fully allocated Prometheus default ports (9100-9999) and /etc/services. */
const DEFAULT_EXPORTER_PORT = 8677;
export const DEFAULT_LISTEN = `127.0.0.1:${DEFAULT_EXPORTER_PORT}`;

export interface ListenAddress {
  /** An address or a host name; null: every address of the host (":PORT"). */
  host: string | null;
  port: number;
}

/** A host name as DNS spells it (letters, digits, hyphens, dots), or an IPv4 address. */
const HOST_NAME = /^[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$/;
/** What may stand between the brackets of an IPv6 address (a zone after % included: fe80::1%eth0). */
const IPV6 = /^[0-9A-Fa-f:.]{2,45}(?:%[A-Za-z0-9_.-]{1,15})?$/;

/** "127.0.0.1:8677", "[::1]:8677", "localhost:8677", ":8677"; port 0 picks a free one (tests). */
export function parseListenAddress(text: string): ListenAddress {
  const fix = `use [HOST]:PORT, e.g. --listen ${DEFAULT_LISTEN}, --listen [::1]:${DEFAULT_EXPORTER_PORT} or --listen :${DEFAULT_EXPORTER_PORT} (every address)`;
  const bad = (why: string): Error => cannotError(`use --listen ${JSON.stringify(text)}`, why, fix);
  const colon = text.lastIndexOf(':');
  if (colon < 0) throw bad('no :PORT');
  const hostPart = text.slice(0, colon);
  const portPart = text.slice(colon + 1);
  if (!/^\d{1,5}$/.test(portPart)) throw bad(`port ${JSON.stringify(portPart)} is not a number`);
  const port = Number(portPart);
  if (port > 65535) throw bad(`port ${port} is over 65535`);
  if (hostPart === '') return { host: null, port };
  if (hostPart.startsWith('[')) {
    const inner = hostPart.endsWith(']') ? hostPart.slice(1, -1) : null;
    if (inner === null || !IPV6.test(inner) || !inner.includes(':')) throw bad(`${hostPart} is not a bracketed IPv6 address`);
    return { host: inner, port };
  }
  if (hostPart.includes(':')) throw bad('an IPv6 address needs brackets');
  if (!HOST_NAME.test(hostPart)) throw bad(`${JSON.stringify(hostPart)} is neither an address nor a host name`);
  return { host: hostPart, port };
}

/** How an address reads in a URL or a log: "[::1]:8677", "127.0.0.1:8677", ":8677". */
export function formatListenAddress(a: ListenAddress): string {
  const host = a.host === null ? '' : a.host.includes(':') ? `[${a.host}]` : a.host;
  return `${host}:${a.port}`;
}
