/** Memory: memfd with seals, shared mappings of a file, and memory given back (malloc_trim, madvise). */
import koffi from 'koffi';
import { errnoError, fcntl, libc } from './errno.js';

const fn = {
  malloc_trim: libc.func('int malloc_trim(size_t pad)'),
  madvise: libc.func('int madvise(uintptr_t addr, size_t length, int advice)'),
  memfd_create: libc.func('int memfd_create(const char *name, unsigned int flags)'),
  mmap: libc.func('void *mmap(void *addr, size_t len, int prot, int flags, int fd, long off)'),
  munmap: libc.func('int munmap(void *addr, size_t len)'),
};

/** Gives free heap memory back to the kernel (glibc malloc_trim(0)). */
export function mallocTrim(): void {
  fn.malloc_trim(0);
}

const MADV_DONTNEED = 4;

/** madvise(MADV_DONTNEED): only for clean file-backed pages; anonymous or copied ones would lose their contents. */
export function dropMappedPages(start: bigint, end: bigint): void {
  if ((fn.madvise(start, end - start, MADV_DONTNEED) as number) !== 0) throw errnoError('madvise(MADV_DONTNEED)');
}

const MFD_CLOEXEC = 0x1;
const MFD_ALLOW_SEALING = 0x2;
const F_ADD_SEALS = 1033;
const F_GET_SEALS = 1034;
export const F_SEAL_SEAL = 0x1;
export const F_SEAL_SHRINK = 0x2;
export const F_SEAL_GROW = 0x4;
export const F_SEAL_WRITE = 0x8;
export const F_SEAL_FUTURE_WRITE = 0x10;
/** memfd names are at most 249 bytes (the kernel prefixes "memfd:" within NAME_MAX). */
const MAX_MEMFD_NAME_BYTES = 249;

/** memfd_create(2) with MFD_CLOEXEC | MFD_ALLOW_SEALING: an anonymous file that can be sealed. */
export function memfdCreate(name: string): number {
  if (Buffer.byteLength(name) > MAX_MEMFD_NAME_BYTES || name.includes('\0')) {
    throw new RangeError(`memfd_create: the name must be at most ${MAX_MEMFD_NAME_BYTES} bytes with no NUL`);
  }
  const fd = fn.memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING) as number;
  if (fd < 0) throw errnoError(`memfd_create(${name})`);
  return fd;
}

/** fcntl(F_ADD_SEALS); EPERM once F_SEAL_SEAL is set, EBUSY for F_SEAL_WRITE over a writable mapping. */
export function addSeals(fd: number, seals: number): void {
  if ((fcntl(fd, F_ADD_SEALS, 'int', seals) as number) < 0) throw errnoError(`fcntl(${fd}, F_ADD_SEALS)`);
}

/** fcntl(F_GET_SEALS) (EINVAL for a file that cannot be sealed). */
export function getSeals(fd: number): number {
  const seals = fcntl(fd, F_GET_SEALS) as number;
  if (seals < 0) throw errnoError(`fcntl(${fd}, F_GET_SEALS)`);
  return seals;
}

/** Why `fd` is not a memfd sealed with all of `seals` (it could still be changed), or null when it is. */
export function unsealedWhy(fd: number, seals: number): string | null {
  let got: number;
  try {
    got = getSeals(fd);
  } catch (e) {
    return `fd ${fd} is not a memfd (${(e as Error).message})`;
  }
  if ((got & seals) === seals) return null;
  return `the memfd has seals 0x${got.toString(16)}, not all of 0x${seals.toString(16)}: it could still be changed`;
}

const PROT_READ = 0x1;
const PROT_WRITE = 0x2;
const MAP_SHARED = 0x1;
const MAP_FAILED = 0xffffffffffffffffn;

export interface SharedMapping {
  /** Stores go to the file. Never touched after unmap(): the pages are gone. */
  readonly memory: ArrayBuffer;
  readonly length: number;
  /** munmap(2); a second call does nothing. */
  unmap(): void;
}

/** mmap(2) of the first `length` bytes of `fd`, MAP_SHARED; the mapping outlives the fd. */
export function mapShared(fd: number, length: number, writable: boolean): SharedMapping {
  if (!Number.isInteger(length) || length <= 0) throw new RangeError(`mmap: length ${length} is not a size`);
  const ptr = fn.mmap(null, length, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0) as unknown;
  if (ptr === null || BigInt(koffi.address(ptr)) === MAP_FAILED) throw errnoError(`mmap(fd ${fd}, ${length})`);
  const memory = koffi.view(ptr, length) as ArrayBuffer;
  let mapped = true;
  return {
    memory,
    length,
    unmap() {
      if (!mapped) return;
      mapped = false;
      fn.munmap(ptr, length);
    },
  };
}
