/** bcrypt by libxcrypt's crypt_rn (PAM's: on every Debian, Ubuntu, RHEL), on a worker thread: a 70 ms hash never holds the loop. */
import koffi, { type KoffiFunc, type LibraryHandle } from 'koffi';
import { timingSafeEqual } from 'node:crypto';
import { cannotError } from '../common/errors.js';

/** sizeof(struct crypt_data) in libxcrypt; crypt_rn refuses a smaller buffer. */
const CRYPT_DATA_SIZE = 32768;

/** The bcrypt costs `bcryptHash` makes: libxcrypt takes 4..31; past 16 a check takes seconds. */
export const BCRYPT_COST = { min: 4, max: 16, default: 10 } as const;
/** bcrypt reads at most this many bytes of a password: a longer one would be checked on its start only. */
const BCRYPT_MAX_PASSWORD_BYTES = 72;

type CryptRn = KoffiFunc<(phrase: string, setting: string, data: Buffer, size: number) => string | null>;
type CryptGensaltRn = KoffiFunc<(prefix: string, count: number, rbytes: null, nrbytes: number, out: Buffer, size: number) => string | null>;
let cryptRn: CryptRn | null = null;
let cryptGensaltRn: CryptGensaltRn | null = null;

function load(): CryptRn {
  if (cryptRn !== null) return cryptRn;
  let lib: LibraryHandle;
  try {
    lib = koffi.load('libcrypt.so.1');
  } catch (e) {
    throw cannotError(
      'check passwords',
      `libcrypt.so.1 does not load (${(e as Error).message})`,
      'install libcrypt1 (Debian, Ubuntu) or libxcrypt (RHEL)',
    );
  }
  cryptRn = lib.func('const char *crypt_rn(const char *phrase, const char *setting, void *data, int size)') as CryptRn;
  // rbytes NULL: libxcrypt takes the salt's random bytes from the kernel (getentropy).
  cryptGensaltRn = lib.func(
    'const char *crypt_gensalt_rn(const char *prefix, unsigned long count, const char *rbytes, int nrbytes, void *output, int output_size)',
  ) as CryptGensaltRn;
  return cryptRn;
}

/** Loads the library now, so that a host without it fails at start, not at the first request. */
export function checkBcryptAvailable(): void {
  load();
}

function cryptAsync(fn: CryptRn, phrase: string, setting: string): Promise<string | null> {
  const data = Buffer.alloc(CRYPT_DATA_SIZE);
  return new Promise((resolve, reject) => {
    fn.async(phrase, setting, data, data.length, (err: unknown, res) => (err ? reject(err as Error) : resolve(res)));
  });
}

/** Whether `password` hashes to `hash` ($2a$, $2b$ or $2y$). A password holding NUL never matches (C strings end there). */
export async function bcryptVerify(password: string, hash: string): Promise<boolean> {
  const fn = load();
  if (password.includes('\0') || hash.includes('\0')) return false;
  const out = await cryptAsync(fn, password, hash);
  if (out === null) return false;
  const a = Buffer.from(out);
  const b = Buffer.from(hash);
  return a.length === b.length && timingSafeEqual(a, b);
}

/** The $2b$ bcrypt hash of `password` at `cost` with a fresh random salt, as web configuration files take it. */
export async function bcryptHash(password: string, cost: number = BCRYPT_COST.default): Promise<string> {
  const fn = load();
  if (!Number.isInteger(cost) || cost < BCRYPT_COST.min || cost > BCRYPT_COST.max)
    throw cannotError(
      'hash the password',
      `cost ${cost} is not an integer in ${BCRYPT_COST.min}..${BCRYPT_COST.max}`,
      `give --cost ${BCRYPT_COST.default}`,
    );
  if (password.includes('\0')) throw cannotError('hash the password', 'it holds a NUL byte', 'choose a password without one');
  if (Buffer.byteLength(password) > BCRYPT_MAX_PASSWORD_BYTES)
    throw cannotError(
      'hash the password',
      `it is longer than ${BCRYPT_MAX_PASSWORD_BYTES} bytes, and bcrypt reads only that many`,
      'choose a shorter one',
    );
  const saltBuf = Buffer.alloc(64);
  const setting = cryptGensaltRn!('$2b$', cost, null, 0, saltBuf, saltBuf.length);
  if (setting === null) throw cannotError('hash the password', 'libcrypt made no bcrypt salt', 'install libcrypt1 4.1 or newer');
  const out = await cryptAsync(fn, password, setting);
  if (out === null || !out.startsWith('$2b$')) throw cannotError('hash the password', 'libcrypt refused the bcrypt setting');
  return out;
}
