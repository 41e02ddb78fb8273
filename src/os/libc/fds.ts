/** Calls on an fd: pread/pwrite/read/write without Node's fs, dup and close-on-exec, close, readable watches and epoll, and more. */
import koffi from 'koffi';
import { checkLength, errnoError, fcntl, libc, orErrno } from './errno.js';

const fn = {
  close: libc.func('int close(int fd)'),
  dup2: libc.func('int dup2(int oldfd, int newfd)'),
  pread: libc.func('long pread(int fd, void *buf, size_t count, long offset)'),
  epoll_create1: libc.func('int epoll_create1(int flags)'),
  epoll_ctl: libc.func('int epoll_ctl(int epfd, int op, int fd, void *event)'),
  epoll_wait: libc.func('int epoll_wait(int epfd, void *events, int maxevents, int timeout)'),
  pwrite: libc.func('long pwrite(int fd, const void *buf, size_t count, long offset)'),
  ftruncate: libc.func('int ftruncate(int fd, long length)'),
  write: libc.func('long write(int fd, const void *buf, size_t count)'),
  fchmod: libc.func('int fchmod(int fd, uint32_t mode)'),
  fsetxattr: libc.func('int fsetxattr(int fd, const char *name, const void *value, size_t size, int flags)'),
  fstat: libc.func('int fstat(int fd, void *buf)'),
  read: libc.func('long read(int fd, void *buf, size_t count)'),
};

/** pread(2): the count read, or -errno: no exception on the sampler's thousands of reads per interval, where ESRCH is routine. */
export function pread(fd: number, buf: Buffer, length: number, offset: number): number {
  checkLength('pread', buf, length);
  return orErrno(fn.pread(fd, buf, length, offset));
}

const EPOLL_CLOEXEC = 0o2000000;
const EPOLL_CTL_ADD = 1;
const EPOLLIN = 1;
/** x86_64's struct epoll_event is packed: u32 events, u64 data. */
const EPOLL_EVENT_SIZE = 12;
const epollEvent = Buffer.alloc(EPOLL_EVENT_SIZE);

/** A new epoll set (close-on-exec): its fd, or -errno. */
export function epollCreate(): number {
  return orErrno(fn.epoll_create1(EPOLL_CLOEXEC));
}

/** Watches `fd` for reading in the set `epfd`, with `data` (a u32) handed back when it is ready: 0, or -errno. */
export function epollAdd(epfd: number, fd: number, data: number): number {
  epollEvent.writeUInt32LE(EPOLLIN, 0);
  epollEvent.writeBigUInt64LE(BigInt(data >>> 0), 4);
  return orErrno(fn.epoll_ctl(epfd, EPOLL_CTL_ADD, fd, epollEvent));
}

/** The data of the fds of `epfd` ready now (epoll_wait, zero timeout), at most `buf.length / 12`; [-errno] when it fails. */
export function epollReadyNow(epfd: number, buf: Buffer): number[] {
  const n = fn.epoll_wait(epfd, buf, Math.floor(buf.length / EPOLL_EVENT_SIZE), 0) as number;
  if (n < 0) return [-koffi.errno()];
  const out: number[] = [];
  for (let i = 0; i < n; i++) out.push(Number(buf.readBigUInt64LE(i * EPOLL_EVENT_SIZE + 4)));
  return out;
}

const soleReady = Buffer.alloc(2 * EPOLL_EVENT_SIZE);

/**
 * What `epfd` has ready now (epoll_wait, zero timeout; a level-triggered set keeps it ready for its owner): nothing, several
 * (or an error), or the low 32 bits of the one ready entry's data (in libuv's set: its fd).
 */
export function epollSoleReady(epfd: number): number | 'nothing' | 'several' {
  const n = fn.epoll_wait(epfd, soleReady, 2, 0) as number;
  return n === 0 ? 'nothing' : n === 1 ? soleReady.readInt32LE(4) : 'several';
}

const F_GETFD = 1;
const F_SETFD = 2;
const FD_CLOEXEC = 1;
const F_DUPFD_CLOEXEC = 1030;

/** A second fd for the file description of `fd` (close-on-exec), or -errno (EMFILE when out of fds). */
export function dupCloexec(fd: number): number {
  return orErrno(fcntl(fd, F_DUPFD_CLOEXEC, 'int', 0));
}

/** Makes `newfd` a copy of `oldfd` (closing what `newfd` was); the copy survives execve. Throws with errno. */
export function dup2(oldfd: number, newfd: number): void {
  if ((fn.dup2(oldfd, newfd) as number) < 0) throw errnoError(`dup2(${oldfd}, ${newfd})`);
}

/** Sets `fd` close-on-exec, or (off) lets it survive execve: Node opens everything close-on-exec, its own stdio included. */
export function setCloexec(fd: number, on: boolean): void {
  const flags = fcntl(fd, F_GETFD) as number;
  if (flags < 0) throw errnoError(`fcntl(${fd}, F_GETFD)`);
  const want = on ? flags | FD_CLOEXEC : flags & ~FD_CLOEXEC;
  if (want !== flags && (fcntl(fd, F_SETFD, 'int', want) as number) < 0) throw errnoError(`fcntl(${fd}, F_SETFD)`);
}

/** close(2); errors (EBADF) are ignored: after close nothing is left to do. */
export function closeFd(fd: number): void {
  fn.close(fd);
}

export interface FdWatch {
  close(): void;
}

/**
 * Calls `onReadable` whenever `fd` has something to read (or an error to report), level-triggered. Never an fd a net.Socket
 * watches itself (libuv keeps one watcher per fd number): give it a duplicate (dupCloexec).
 */
export function watchReadable(fd: number, onReadable: () => void): FdWatch {
  const handle = koffi.node.poll(fd, { readable: true, disconnect: true }, () => onReadable());
  return { close: () => handle.close() };
}

// pwrite, ftruncate, write, fchmod, fsetxattr, fstat, read: the count (or 0), or -errno.
export function pwriteFd(fd: number, buf: Buffer, length: number, offset: number): number {
  checkLength('pwrite', buf, length);
  return orErrno(fn.pwrite(fd, buf, length, offset));
}

export function truncateFd(fd: number, length: number): number {
  return orErrno(fn.ftruncate(fd, length));
}

export function writeFd(fd: number, buf: Buffer, length: number): number {
  checkLength('write', buf, length);
  return orErrno(fn.write(fd, buf, length));
}

export function fchmodFd(fd: number, mode: number): number {
  return orErrno(fn.fchmod(fd, mode));
}

export function fsetxattrFd(fd: number, name: string, value: Buffer): number {
  return orErrno(fn.fsetxattr(fd, name, value, value.length, 0));
}

/** Bytes of x86_64's struct stat (asm/stat.h): the buffer fstatRaw fills. */
export const STAT_SIZE = 144;
/** Where st_atim lies in it (16 bytes: seconds, then nanoseconds). */
export const STAT_ATIME_AT = 72;

/** fstat(2) into `buf` as the kernel lays it out: for many fds each sample (Node's fstatSync makes an object of BigInts). */
export function fstatRaw(fd: number, buf: Buffer): number {
  checkLength('fstat', buf, STAT_SIZE);
  return orErrno(fn.fstat(fd, buf));
}

export function readFd(fd: number, buf: Buffer, length: number): number {
  checkLength('read', buf, length);
  return orErrno(fn.read(fd, buf, length));
}
