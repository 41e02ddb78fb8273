import { execFileSync } from 'node:child_process';
import { describe, expect, test } from 'vitest';
import { bcryptVerify } from '../../src/os/bcrypt.js';
import { PYTHON } from '../support/fake-qemu.js';

/** Published vectors (jBCrypt's and OpenBSD's test suites): password, full hash. */
const VECTORS: [string, string][] = [
  ['', '$2a$06$DCq7YPn5Rq63x1Lad4cll.TV4S6ytwfsfvkgY8jIucDrjc8deX1s.'],
  ['a', '$2a$06$m0CrhHm10qJ3lXRY.5zDGO3rS2KdeeWLuGmsfGlMfOxih58VYVfxe'],
  ['abc', '$2a$06$If6bvum7DFjUnE9p2uDeDu0YHzrHM6tf.iqN8.yx.jNN1ILEf7h0i'],
  ['abcdefghijklmnopqrstuvwxyz', '$2a$06$.rCVZVOThsIa97pEDOxvGuRRgzG64bvtJ0938xuqzv18d3ZpQhstC'],
  ['~!@#$%^&*()      ~!@#$%^&*()PNBFRD', '$2a$06$fPIsBO8qRqkjj273rfaOI.HtSV9jLDpTbZn782DC6/t7qT67P6FfO'],
];

/** A $2y$ hash of `password` at `cost`, made by the C library through Python (the form htpasswd -B writes). */
function hashWithPython(password: string, cost: number): string | null {
  try {
    const out = execFileSync(
      PYTHON,
      [
        '-W',
        'ignore',
        '-c',
        'import crypt,sys; h=crypt.crypt(sys.argv[1], crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=2**int(sys.argv[2]))); print(h)',
        password,
        String(cost),
      ],
      { encoding: 'utf8' },
    ).trim();
    return out.startsWith('$2') ? `$2y$${out.slice(4)}` : null;
  } catch {
    return null;
  }
}

describe('bcrypt verification', () => {
  test('bcryptVerify accepts the published vectors and refuses a changed password', async () => {
    for (const [password, hash] of VECTORS) {
      expect(await bcryptVerify(password, hash)).toBe(true);
      expect(await bcryptVerify(`${password}x`, hash)).toBe(false);
    }
  });

  test('bcryptVerify accepts the $2y$ form htpasswd writes and refuses malformed hashes and NUL', async (ctx) => {
    const hash = hashWithPython('s3cret pass', 4);
    if (hash === null) ctx.skip("Python's crypt module cannot make a bcrypt hash here");
    expect(await bcryptVerify('s3cret pass', hash!)).toBe(true);
    expect(await bcryptVerify('s3cret pas', hash!)).toBe(false);
    expect(await bcryptVerify('s3cret pass\0more', hash!)).toBe(false);
    expect(await bcryptVerify('s3cret pass', hash!.slice(0, -1))).toBe(false);
    expect(await bcryptVerify('s3cret pass', '$1$abc$def')).toBe(false);
    expect(await bcryptVerify('s3cret pass', '')).toBe(false);
  });

  test('bcryptVerify at cost 10 leaves the event loop free while it hashes', async () => {
    const hash = VECTORS[2]![1].replace('$06$', '$10$');
    // A timer due in 5 ms must fire long before the 50+ ms a cost-10 hash takes on this machine.
    let fired = 0;
    const t = setInterval(() => fired++, 5);
    const t0 = performance.now();
    await bcryptVerify('abc', hash);
    const took = performance.now() - t0;
    clearInterval(t);
    expect(took).toBeGreaterThan(20);
    // Generous: a shared 2-core machine may delay timers, but a blocked loop fires none at all.
    expect(fired).toBeGreaterThanOrEqual(2);
  });
});
