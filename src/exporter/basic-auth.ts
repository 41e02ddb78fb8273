/**
 * HTTP basic authentication against the web configuration's bcrypt hashes. A user and password
 * that matched are remembered (a hash of user, stored hash and password; never the password) so
 * that a scraper pays bcrypt's cost once, not on every scrape; a wrong password pays it every time.
 * An unknown user is checked against a dummy hash of the same cost, so the time taken does not tell
 * whether a user exists. At most MAX_CONCURRENT_VERIFICATIONS hashes are computed at once: a client
 * sending wrong passwords in a loop takes that share of the CPU and no more.
 */
import { createHash } from 'node:crypto';
import { bcryptVerify } from '../os/bcrypt.js';

/** Remembered good (user, hash, password) triples; the oldest is forgotten first. */
const AUTH_CACHE_ENTRIES = 100;
/** bcrypt computations at once; more requests wait their turn (the connection slots bound them). */
export const MAX_CONCURRENT_VERIFICATIONS = 2;
/** An Authorization header longer than this is refused unread. */
export const MAX_AUTHORIZATION_BYTES = 1024;

/** A valid bcrypt hash (cost 10) of a random password no one knows, for unknown users. */
const DUMMY_HASH = '$2b$10$/whscb3jtHsGRz3paEOGsuKtZLFzzRZ/fHu.G5msmvy/VBkcwMRhe';

export const WWW_AUTHENTICATE = 'Basic realm="vmsr-helper exporter", charset="UTF-8"';

/** The user and password of a Basic Authorization header, or null. */
export function parseBasicAuthorization(header: string | undefined): { user: string; password: string } | null {
  if (header === undefined || header.length > MAX_AUTHORIZATION_BYTES) return null;
  const m = /^Basic +([A-Za-z0-9+/]+={0,2}) *$/i.exec(header);
  if (m === null) return null;
  const text = Buffer.from(m[1]!, 'base64').toString('utf8');
  const colon = text.indexOf(':');
  if (colon < 0) return null;
  return { user: text.slice(0, colon), password: text.slice(colon + 1) };
}

export class BasicAuth {
  private readonly good = new Set<string>();
  private running = 0;
  private readonly waiting: (() => void)[] = [];

  /** Whether `header` names a user of `users` with its password. */
  async check(users: ReadonlyMap<string, string>, header: string | undefined): Promise<boolean> {
    const creds = parseBasicAuthorization(header);
    if (creds === null) return false;
    const stored = users.get(creds.user);
    const hash = stored ?? DUMMY_HASH;
    const key = createHash('sha256').update(`${creds.user}\0${hash}\0${creds.password}`).digest('base64');
    if (stored !== undefined && this.good.has(key)) return true;
    const ok = await this.limited(() => bcryptVerify(creds.password, hash));
    if (!ok || stored === undefined) return false;
    this.good.add(key);
    if (this.good.size > AUTH_CACHE_ENTRIES) this.good.delete(this.good.values().next().value!);
    return true;
  }

  private async limited<T>(f: () => Promise<T>): Promise<T> {
    // A finishing computation hands its turn to the next waiter, so no newcomer slips in between.
    if (this.running >= MAX_CONCURRENT_VERIFICATIONS) await new Promise<void>((r) => this.waiting.push(r));
    else this.running++;
    try {
      return await f();
    } finally {
      const next = this.waiting.shift();
      if (next) next();
      else this.running--;
    }
  }
}
