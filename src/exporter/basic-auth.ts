/**
 * HTTP basic authentication against the web configuration's bcrypt hashes (docs/security.md "Wrong
 * passwords against the scraper"). An unknown user is checked against a dummy hash, so timing does not tell who exists.
 */
import { createHash } from 'node:crypto';
import { bcryptVerify } from '../os/bcrypt.js';
import { FailedCheckBudget } from './auth-failures.js';

/** Remembered good (user, hash, password) triples; the oldest is forgotten first. */
const AUTH_CACHE_ENTRIES = 100;
/** bcrypt computations at once. */
export const MAX_CONCURRENT_VERIFICATIONS = 2;
/** Checks waiting for a turn; one more is answered 429 at once. */
const MAX_WAITING_VERIFICATIONS = 4;

/** What a request's credentials are: right, wrong (or none), or not checked now (too many failed checks, or too many waiting). */
type AuthVerdict = 'ok' | 'refused' | 'limited';
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
  private readonly failures = new FailedCheckBudget();
  private running = 0;
  private readonly waiting: (() => void)[] = [];

  /** The verdict on `header` from `source` (sourceOf of the client's address). */
  async verdict(users: ReadonlyMap<string, string>, header: string | undefined, source: string): Promise<AuthVerdict> {
    const creds = parseBasicAuthorization(header);
    if (creds === null) return 'refused';
    const stored = users.get(creds.user);
    const hash = stored ?? DUMMY_HASH;
    const key = createHash('sha256').update(`${creds.user}\0${hash}\0${creds.password}`).digest('base64');
    if (stored !== undefined && this.good.has(key)) return 'ok';
    if (this.running >= MAX_CONCURRENT_VERIFICATIONS && this.waiting.length >= MAX_WAITING_VERIFICATIONS) return 'limited';
    if (!this.failures.take(source)) return 'limited';
    const ok = (await this.limited(() => bcryptVerify(creds.password, hash))) && stored !== undefined;
    if (!ok) return 'refused';
    this.failures.refund(source);
    this.good.add(key);
    if (this.good.size > AUTH_CACHE_ENTRIES) this.good.delete(this.good.values().next().value!);
    return 'ok';
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
