import { describe, expect, test } from 'vitest';
import {
  BasicAuth,
  MAX_AUTHORIZATION_BYTES,
  MAX_CONCURRENT_VERIFICATIONS,
  parseBasicAuthorization,
} from '../../src/exporter/basic-auth.js';
import { PASSWORD, PASSWORD_HASH, PASSWORD_HASH_COST10, USER } from './support/tls-files.js';

const header = (creds: string) => `Basic ${Buffer.from(creds).toString('base64')}`;
const users = new Map([[USER, PASSWORD_HASH]]);
const SLOW_HASH = PASSWORD_HASH_COST10;

/** Whether the verdict on `h`, as from one source, is 'ok'. */
const passes = async (auth: BasicAuth, users: ReadonlyMap<string, string>, h: string | undefined) =>
  (await auth.verdict(users, h, 'local')) === 'ok';

describe('basic authentication', () => {
  test('an Authorization header gives its user and password; anything else gives nothing', () => {
    expect(parseBasicAuthorization(header('alice:pa:ss'))).toEqual({ user: 'alice', password: 'pa:ss' });
    expect(parseBasicAuthorization(`basic  ${Buffer.from('a:').toString('base64')}`)).toEqual({ user: 'a', password: '' });
    for (const bad of [undefined, '', 'Bearer x', 'Basic', 'Basic !!!', header('no-colon'), `Basic ${'A'.repeat(MAX_AUTHORIZATION_BYTES)}`])
      expect(parseBasicAuthorization(bad), String(bad)).toBeNull();
  });

  test('the right password passes; a wrong one, an unknown user or no header does not', async () => {
    const auth = new BasicAuth();
    expect(await passes(auth, users, header(`${USER}:${PASSWORD}`))).toBe(true);
    expect(await passes(auth, users, header(`${USER}:${PASSWORD}x`))).toBe(false);
    expect(await passes(auth, users, header(`someone:${PASSWORD}`))).toBe(false);
    expect(await passes(auth, users, undefined)).toBe(false);
    // A remembered success is for that user and hash only: another hash for the user is checked again.
    expect(await passes(auth, new Map([[USER, SLOW_HASH.replace(/.$/, 'x')]]), header(`${USER}:${PASSWORD}`))).toBe(false);
  });

  test('a right password is hashed once, then remembered; a wrong one is hashed every time', async () => {
    const auth = new BasicAuth();
    const slow = new Map([[USER, SLOW_HASH]]);
    const time = async (h: string) => {
      const t0 = performance.now();
      const ok = await passes(auth, slow, h);
      return { ok, ms: performance.now() - t0 };
    };
    const first = await time(header(`${USER}:${PASSWORD}`));
    expect(first.ok).toBe(true);
    expect(first.ms).toBeGreaterThan(20);
    const again = await time(header(`${USER}:${PASSWORD}`));
    expect(again.ok).toBe(true);
    // Remembered: no bcrypt at all, well under the 20+ ms one hash takes (margin for a busy machine).
    expect(again.ms).toBeLessThan(first.ms / 2);
    const wrong = await time(header(`${USER}:nope`));
    expect(wrong.ok).toBe(false);
    expect(wrong.ms).toBeGreaterThan(20);
  });

  test(`at most ${MAX_CONCURRENT_VERIFICATIONS} hashes run at once, and every waiting check still gets its answer`, async () => {
    const auth = new BasicAuth();
    const slow = new Map([[USER, SLOW_HASH]]);
    let running = 0;
    let most = 0;
    const limited = auth as unknown as { limited<T>(f: () => Promise<T>): Promise<T> };
    const original = limited.limited.bind(auth);
    limited.limited = <T>(f: () => Promise<T>) =>
      original(async () => {
        most = Math.max(most, ++running);
        try {
          return await f();
        } finally {
          running--;
        }
      });
    const results = await Promise.all(Array.from({ length: 6 }, (_, i) => passes(auth, slow, header(`${USER}:wrong${i}`))));
    expect(results).toEqual(Array(6).fill(false));
    expect(most).toBe(MAX_CONCURRENT_VERIFICATIONS);
  });
});
