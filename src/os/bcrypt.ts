/**
 * bcrypt verification through the C library's crypt (libxcrypt, libcrypt.so.1, which every Debian,
 * Ubuntu and RHEL host has: login and PAM use it), called with koffi on a worker thread so that a
 * hash of cost 10 (about 70 ms) never holds up the event loop. The result is compared with the
 * stored hash in constant time.
 */
import koffi, { type KoffiFunc, type LibraryHandle } from 'koffi';
import { timingSafeEqual } from 'node:crypto';
import { cannot } from '../common/errors.js';

/** sizeof(struct crypt_data) in libxcrypt; crypt_rn refuses a smaller buffer. */
const CRYPT_DATA_SIZE = 32768;

type CryptRn = KoffiFunc<(phrase: string, setting: string, data: Buffer, size: number) => string | null>;
let cryptRn: CryptRn | null = null;

function load(): CryptRn {
  if (cryptRn !== null) return cryptRn;
  let lib: LibraryHandle;
  try {
    lib = koffi.load('libcrypt.so.1');
  } catch (e) {
    throw new Error(
      cannot(
        'check passwords',
        `libcrypt.so.1 does not load (${(e as Error).message})`,
        'install libcrypt1 (Debian, Ubuntu) or libxcrypt (RHEL)',
      ),
    );
  }
  cryptRn = lib.func('const char *crypt_rn(const char *phrase, const char *setting, void *data, int size)') as CryptRn;
  return cryptRn;
}

/** Loads the library now, so that a host without it fails at start, not at the first request. */
export function checkBcryptAvailable(): void {
  load();
}

/** Whether `password` hashes to `hash` ($2a$, $2b$ or $2y$). A password holding NUL never matches (C strings end there). */
export async function bcryptVerify(password: string, hash: string): Promise<boolean> {
  const fn = load();
  if (password.includes('\0') || hash.includes('\0')) return false;
  const data = Buffer.alloc(CRYPT_DATA_SIZE);
  const out = await new Promise<string | null>((resolve, reject) => {
    fn.async(password, hash, data, data.length, (err: unknown, res) => (err ? reject(err as Error) : resolve(res)));
  });
  if (out === null) return false;
  const a = Buffer.from(out);
  const b = Buffer.from(hash);
  return a.length === b.length && timingSafeEqual(a, b);
}
