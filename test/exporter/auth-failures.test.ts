/**
 * The failed-check budget (exporter/auth-failures.ts) and what BasicAuth makes of it: a source past
 * its failed checks gets 'limited' without a hash, a remembered password never waits for anything.
 */
import { describe, expect, test } from 'vitest';
import { FAILED_CHECK_REFILL_MS, FAILED_CHECKS_BURST, FailedCheckBudget, MAX_SOURCES, sourceOf } from '../../src/exporter/auth-failures.js';
import { BasicAuth } from '../../src/exporter/basic-auth.js';
import { PASSWORD, PASSWORD_HASH, USER } from './support/tls-files.js';

const header = (creds: string) => `Basic ${Buffer.from(creds).toString('base64')}`;

describe('failed password checks', () => {
  test('a source is an IPv4 address (mapped or not) or an IPv6 /64', () => {
    expect(sourceOf('127.0.0.1')).toBe('127.0.0.1');
    expect(sourceOf('::ffff:10.1.2.3')).toBe('10.1.2.3');
    expect(sourceOf('2001:db8:1:2:aaaa::1')).toBe('2001:db8:1:2');
    expect(sourceOf('2001:db8:1:2:bbbb:cccc:dddd:eeee')).toBe('2001:db8:1:2');
    expect(sourceOf('::1')).toBe('0:0:0:0');
    expect(sourceOf(undefined)).toBe('?');
  });

  test('a source has FAILED_CHECKS_BURST checks, then one per FAILED_CHECK_REFILL_MS; a success costs nothing', () => {
    let now = 0;
    const b = new FailedCheckBudget(() => now);
    for (let i = 0; i < FAILED_CHECKS_BURST; i++) expect(b.take('a')).toBe(true);
    expect(b.take('a')).toBe(false);
    expect(b.take('b')).toBe(true); // another source is not affected
    now += FAILED_CHECK_REFILL_MS;
    expect(b.take('a')).toBe(true);
    b.refund('a');
    expect(b.take('a')).toBe(true);
    expect(b.take('a')).toBe(false);
  });

  test('the table holds at most MAX_SOURCES sources: past them the one unseen the longest is forgotten', () => {
    const b = new FailedCheckBudget(() => 0);
    for (const s of ['first', 'second']) for (let i = 0; i < FAILED_CHECKS_BURST; i++) b.take(s);
    for (let i = 0; i < MAX_SOURCES - 1; i++) b.take(`s${i}`);
    // MAX_SOURCES + 1 sources were seen: 'second' is still limited, 'first' starts afresh.
    expect(b.take('second')).toBe(false);
    expect(b.take('first')).toBe(true);
  });

  test('past its budget a source is limited without a hash, and a remembered password is still answered at once', async () => {
    const auth = new BasicAuth();
    const users = new Map([[USER, PASSWORD_HASH]]);
    expect(await auth.verdict(users, header(`${USER}:${PASSWORD}`), 'x')).toBe('ok');
    for (let i = 0; i < FAILED_CHECKS_BURST; i++) expect(await auth.verdict(users, header(`${USER}:wrong${i}`), 'x')).toBe('refused');
    expect(await auth.verdict(users, header(`${USER}:wrong-again`), 'x')).toBe('limited');
    expect(await auth.verdict(users, header(`${USER}:${PASSWORD}`), 'x')).toBe('ok');
    // Another source still gets its checks.
    expect(await auth.verdict(users, header(`${USER}:wrong`), 'y')).toBe('refused');
  });
});
