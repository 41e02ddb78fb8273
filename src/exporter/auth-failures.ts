/** How many failed password checks each source may cost the exporter (docs/security.md "Wrong passwords against the scraper"). */
import { ipv4Octets, ipv6Groups } from '../common/ip-address.js';

/** Failed checks a source may have in a row before it waits. */
export const FAILED_CHECKS_BURST = 5;
/** Then one more failed check per this many ms: a flood costs the exporter one bcrypt hash a second per source. */
export const FAILED_CHECK_REFILL_MS = 1000;
/** Sources remembered at once. */
export const MAX_SOURCES = 4096;

/** The key a client's address is limited under: an IPv4 address (also IPv4-mapped IPv6), an IPv6 /64. */
export function sourceOf(address: string | undefined): string {
  if (address === undefined) return '?';
  const v4 = ipv4Octets(address);
  if (v4) return v4.join('.');
  // One host, or one user, commonly has a whole /64.
  const groups = ipv6Groups(address);
  return groups === null ? address.toLowerCase() : groups.slice(0, 4).join(':').toLowerCase();
}

interface Bucket {
  tokens: number;
  at: number;
}

export class FailedCheckBudget {
  private readonly sources = new Map<string, Bucket>();

  constructor(private readonly now: () => number = () => performance.now()) {}

  /** Takes one check for `source`: false when it has none left (answer 429, compute nothing). */
  take(source: string): boolean {
    const t = this.now();
    const b = this.sources.get(source) ?? { tokens: FAILED_CHECKS_BURST, at: t };
    b.tokens = Math.min(FAILED_CHECKS_BURST, b.tokens + (t - b.at) / FAILED_CHECK_REFILL_MS);
    b.at = t;
    // Seen now: to the end of the table's order, the one unseen the longest at its start.
    this.sources.delete(source);
    this.sources.set(source, b);
    if (this.sources.size > MAX_SOURCES) this.sources.delete(this.sources.keys().next().value!);
    if (b.tokens < 1) return false;
    b.tokens -= 1;
    return true;
  }

  /** The check taken for `source` succeeded: it costs nothing. */
  refund(source: string): void {
    const b = this.sources.get(source);
    if (b !== undefined) b.tokens = Math.min(FAILED_CHECKS_BURST, b.tokens + 1);
  }
}
