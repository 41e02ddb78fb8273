/** Paths relative to a directory fd (guest-dir/: nothing followed), leases, inotify; each call gives what the kernel returned or -errno. */
import koffi from 'koffi';
import { fcntl, libc, orErrno } from './errno.js';

const fn = {
  openat: libc.func('int openat(int dirfd, const char *path, int flags, uint32_t mode)'),
  mkdirat: libc.func('int mkdirat(int dirfd, const char *path, uint32_t mode)'),
  renameat: libc.func('int renameat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath)'),
  renameat2: libc.func('int renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned int flags)'),
  unlinkat: libc.func('int unlinkat(int dirfd, const char *path, int flags)'),
  symlinkat: libc.func('int symlinkat(const char *target, int dirfd, const char *path)'),
  readlinkat: libc.func('long readlinkat(int dirfd, const char *path, void *buf, size_t size)'),
  inotify_init1: libc.func('int inotify_init1(int flags)'),
  inotify_add_watch: libc.func('int inotify_add_watch(int fd, const char *path, uint32_t mask)'),
  inotify_rm_watch: libc.func('int inotify_rm_watch(int fd, int wd)'),
};

export const O_RDONLY = 0;
export const O_WRONLY = 0o1;
export const O_RDWR = 0o2;
export const O_CREAT = 0o100;
export const O_EXCL = 0o200;
export const O_NONBLOCK = 0o4000;
export const O_DIRECTORY = 0o200000;
export const O_NOFOLLOW = 0o400000;
const O_CLOEXEC = 0o2000000;
export const O_PATH = 0o10000000;

/** openat(2): an fd of `name` in the directory `dirFd` (O_CLOEXEC added), or -errno (ELOOP: a symlink under O_NOFOLLOW). */
export function openAt(dirFd: number, name: string, flags: number, mode = 0): number {
  return orErrno(fn.openat(dirFd, name, flags | O_CLOEXEC, mode));
}

/** mkdirat(2): 0, or -errno (EEXIST when the name is taken, by anything). */
export function mkdirAt(dirFd: number, name: string, mode: number): number {
  return orErrno(fn.mkdirat(dirFd, name, mode));
}

/** renameat(2) within `dirFd`: replaces `to` at once. 0 or -errno. */
export function renameAt(dirFd: number, from: string, to: string): number {
  return orErrno(fn.renameat(dirFd, from, dirFd, to));
}

const RENAME_EXCHANGE = 2;

/** renameat2(2) RENAME_EXCHANGE within `dirFd`: 0 or -errno (EINVAL where the file system cannot exchange). */
export function exchangeAt(dirFd: number, a: string, b: string): number {
  return orErrno(fn.renameat2(dirFd, a, dirFd, b, RENAME_EXCHANGE));
}

const F_SETSIG = 10;
const F_SETLEASE = 1024;
const F_WRLCK = 1;
const F_UNLCK = 2;
/** SIGURG: ignored unless handled. */
const LEASE_BREAK_SIGNAL = 23;

/**
 * A write lease on `fd`'s file (an open of it waits while held), its break signalled with SIGURG, not SIGIO, whose
 * default ends the process; set each time, as letting a lease go resets F_SETSIG. 0, -EAGAIN when another open file
 * refers to it, or -errno.
 */
export function takeWriteLease(fd: number): number {
  const set = orErrno(fcntl(fd, F_SETSIG, 'int', LEASE_BREAK_SIGNAL));
  return set < 0 ? set : orErrno(fcntl(fd, F_SETLEASE, 'int', F_WRLCK));
}

export function dropLease(fd: number): number {
  return orErrno(fcntl(fd, F_SETLEASE, 'int', F_UNLCK));
}

/** unlinkat(2) (0x200: AT_REMOVEDIR): 0 or -errno. Removes a symlink itself, never what it names. */
export function unlinkAt(dirFd: number, name: string, flags = 0): number {
  return orErrno(fn.unlinkat(dirFd, name, flags));
}

/** symlinkat(2): a symlink `name` in `dirFd` holding `target` (never resolved here). 0 or -errno. */
export function symlinkAt(target: string, dirFd: number, name: string): number {
  return orErrno(fn.symlinkat(target, dirFd, name));
}

const linkBuf = Buffer.alloc(4096);

/** readlinkat(2): the target a symlink holds, or -errno (EINVAL: not a symlink). */
export function readlinkAt(dirFd: number, name: string): string | number {
  const n = Number(fn.readlinkat(dirFd, name, linkBuf, linkBuf.length));
  return n >= 0 ? linkBuf.toString('utf8', 0, n) : -koffi.errno();
}

/** inotify(7) event bits (sys/inotify.h). */
export const IN_ATTRIB = 0x4;
export const IN_MOVED_FROM = 0x40;
export const IN_MOVED_TO = 0x80;
export const IN_CREATE = 0x100;
export const IN_DELETE = 0x200;
export const IN_DELETE_SELF = 0x400;
export const IN_MOVE_SELF = 0x800;
export const IN_Q_OVERFLOW = 0x4000;
const IN_ONLYDIR = 0x01000000;

/** inotify_init1(2), non-blocking and close-on-exec: an fd, or -errno. */
export function inotifyInit(): number {
  return orErrno(fn.inotify_init1(O_NONBLOCK | O_CLOEXEC));
}

/** inotify_add_watch(2) of the directory open as `dirFd` (by /proc/self/fd, no path looked up again); -errno (ENOSPC: too many). */
export function inotifyWatchFd(inotifyFd: number, dirFd: number, mask: number): number {
  return orErrno(fn.inotify_add_watch(inotifyFd, `/proc/self/fd/${dirFd}`, mask | IN_ONLYDIR));
}

export function inotifyUnwatch(inotifyFd: number, wd: number): number {
  return orErrno(fn.inotify_rm_watch(inotifyFd, wd));
}
