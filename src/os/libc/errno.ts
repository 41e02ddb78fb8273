/** libc through koffi (calls Node does not expose, a file per concern), and errno. Pointers are Buffers: JS owns no native memory. */
import koffi from 'koffi';
import os from 'node:os';

export const libc = koffi.load('libc.so.6');
export const fcntl = libc.func('int fcntl(int fd, int cmd, ...)');

/** Error carrying errno, with the libc call named, e.g. "capset: EPERM (Operation not permitted)". */
export function errnoError(call: string, errno = koffi.errno()): NodeJS.ErrnoException {
  const name = errnoName(errno);
  const err: NodeJS.ErrnoException = new Error(`${call}: ${name}`);
  err.errno = errno;
  err.code = name;
  err.syscall = call;
  return err;
}

/** What a call returned (a count, an fd, 0), or -errno when that is negative: no exception on hot paths. */
export function orErrno(r: unknown): number {
  const n = Number(r);
  return n >= 0 ? n : -koffi.errno();
}

/** Throws unless buf[0, length) lies in `buf`. */
export function checkLength(call: string, buf: Buffer, length: number): void {
  if (length > buf.length) throw new RangeError(`${call}: ${length} bytes exceed a buffer of ${buf.length}`);
}

/** The symbolic name of an errno value ("ESRCH"), or "errno N" when Node does not know it. */
export function errnoName(errno: number): string {
  return Object.entries(os.constants.errno).find(([, v]) => v === errno)?.[0] ?? `errno ${errno}`;
}
