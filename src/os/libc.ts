/**
 * The few libc calls Node does not expose, through koffi. Every pointer argument is a Buffer, so no
 * native memory is ever owned by JS. Functions return -1 and set errno like libc; callers turn that
 * into an Error with errnoError().
 */
import koffi from 'koffi';
import os from 'node:os';

const libc = koffi.load('libc.so.6');

/** struct iovec and struct msghdr of x86_64 (anonymous koffi types: this module may be loaded twice in a process). */
const iovecType = koffi.struct({ iov_base: 'void *', iov_len: 'size_t' });
const msghdrType = koffi.struct({
  msg_name: 'void *',
  msg_namelen: 'uint32_t',
  msg_iov: koffi.pointer(iovecType),
  msg_iovlen: 'size_t',
  msg_control: 'void *',
  msg_controllen: 'size_t',
  msg_flags: 'int',
});

const fn = {
  getsockopt: libc.func('int getsockopt(int fd, int level, int optname, void *optval, void *optlen)'),
  socket: libc.func('int socket(int domain, int type, int protocol)'),
  send: libc.func('long send(int fd, const void *buf, size_t len, int flags)'),
  recv: libc.func('long recv(int fd, void *buf, size_t len, int flags)'),
  sendto: libc.func('long sendto(int fd, const void *buf, size_t len, int flags, const void *addr, uint32_t addrlen)'),
  close: libc.func('int close(int fd)'),
  capget: libc.func('int capget(void *hdr, void *data)'),
  capset: libc.func('int capset(void *hdr, void *data)'),
  prctl: libc.func('int prctl(int option, unsigned long arg2, unsigned long arg3, unsigned long arg4, unsigned long arg5)'),
  prctlName: libc.func('prctl', 'int', ['int', 'str', 'ulong', 'ulong', 'ulong']),
  setresuid: libc.func('int setresuid(uint32_t ruid, uint32_t euid, uint32_t suid)'),
  setresgid: libc.func('int setresgid(uint32_t rgid, uint32_t egid, uint32_t sgid)'),
  setgroups: libc.func('int setgroups(size_t size, void *list)'),
  sysconf: libc.func('long sysconf(int name)'),
  getuid: libc.func('uint32_t getuid()'),
  gettid: libc.func('int gettid()'),
  execve: libc.func('int execve(const char *path, const char **argv, const char **envp)'),
  sigaction: libc.func('int sigaction(int sig, const void *act, void *oldact)'),
  alarm: libc.func('unsigned int alarm(unsigned int seconds)'),
  fcntl: libc.func('int fcntl(int fd, int cmd, ...)'),
  dup2: libc.func('int dup2(int oldfd, int newfd)'),
  getrlimit: libc.func('int getrlimit(int resource, void *rlim)'),
  poll: libc.func('int poll(void *fds, unsigned long nfds, int timeout)'),
  malloc_trim: libc.func('int malloc_trim(size_t pad)'),
  pread: libc.func('long pread(int fd, void *buf, size_t count, long offset)'),
  clock_gettime: libc.func('int clock_gettime(int clk, void *ts)'),
  setrlimit: libc.func('int setrlimit(int resource, const void *rlim)'),
  madvise: libc.func('int madvise(uintptr_t addr, size_t length, int advice)'),
  sendmsg: libc.func('sendmsg', 'long', ['int', koffi.pointer(msghdrType), 'int']),
  recvmsg: libc.func('recvmsg', 'long', ['int', koffi.inout(koffi.pointer(msghdrType)), 'int']),
  socketpair: libc.func('int socketpair(int domain, int type, int protocol, _Out_ int *sv)'),
  memfd_create: libc.func('int memfd_create(const char *name, unsigned int flags)'),
  mmap: libc.func('void *mmap(void *addr, size_t len, int prot, int flags, int fd, long off)'),
  munmap: libc.func('int munmap(void *addr, size_t len)'),
  syscall: libc.func('long syscall(long number, ...)'),
  epoll_create1: libc.func('int epoll_create1(int flags)'),
  epoll_ctl: libc.func('int epoll_ctl(int epfd, int op, int fd, void *event)'),
  epoll_wait: libc.func('int epoll_wait(int epfd, void *events, int maxevents, int timeout)'),
  openat: libc.func('int openat(int dirfd, const char *path, int flags, uint32_t mode)'),
  mkdirat: libc.func('int mkdirat(int dirfd, const char *path, uint32_t mode)'),
  renameat: libc.func('int renameat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath)'),
  renameat2: libc.func('int renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned int flags)'),
  pwrite: libc.func('long pwrite(int fd, const void *buf, size_t count, long offset)'),
  ftruncate: libc.func('int ftruncate(int fd, long length)'),
  unlinkat: libc.func('int unlinkat(int dirfd, const char *path, int flags)'),
  symlinkat: libc.func('int symlinkat(const char *target, int dirfd, const char *path)'),
  readlinkat: libc.func('long readlinkat(int dirfd, const char *path, void *buf, size_t size)'),
  write: libc.func('long write(int fd, const void *buf, size_t count)'),
  fchmod: libc.func('int fchmod(int fd, uint32_t mode)'),
  fsetxattr: libc.func('int fsetxattr(int fd, const char *name, const void *value, size_t size, int flags)'),
  fstat: libc.func('int fstat(int fd, void *buf)'),
  read: libc.func('long read(int fd, void *buf, size_t count)'),
  inotify_init1: libc.func('int inotify_init1(int flags)'),
  inotify_add_watch: libc.func('int inotify_add_watch(int fd, const char *path, uint32_t mask)'),
  inotify_rm_watch: libc.func('int inotify_rm_watch(int fd, int wd)'),
};

const SOL_SOCKET = 1;
const SO_PEERCRED = 17;
export const AF_UNIX = 1;
export const SOCK_DGRAM = 2;
export const SOCK_CLOEXEC = 0o2000000;
const MSG_NOSIGNAL = 0x4000;
export const MSG_DONTWAIT = 0x40;
export const SOCK_STREAM = 1;
/** Message boundaries on a connection (the keeper's channel). */
export const SOCK_SEQPACKET = 5;
const SC_CLK_TCK = 2;
export const PR_CAPBSET_DROP = 24;
export const PR_SET_NO_NEW_PRIVS = 38;
const LINUX_CAPABILITY_VERSION_3 = 0x20080522;

/** Error carrying errno, with the libc call named, e.g. "capset: EPERM (Operation not permitted)". */
export function errnoError(call: string, errno = koffi.errno()): NodeJS.ErrnoException {
  const name = errnoName(errno);
  const err: NodeJS.ErrnoException = new Error(`${call}: ${name}`);
  err.errno = errno;
  err.code = name;
  err.syscall = call;
  return err;
}

/** The symbolic name of an errno value ("ESRCH"), or "errno N" when Node does not know it. */
export function errnoName(errno: number): string {
  return Object.entries(os.constants.errno).find(([, v]) => v === errno)?.[0] ?? `errno ${errno}`;
}

/**
 * pread(2) of up to `length` bytes at `offset` into `buf`: the count read, or -errno. No exception
 * and no Node fs binding on this path: the sampler reads thousands of /proc files per interval, and
 * a thread that exited (ESRCH) is routine there, not exceptional.
 */
export function pread(fd: number, buf: Buffer, length: number, offset: number): number {
  if (length > buf.length) throw new RangeError(`pread: ${length} bytes do not fit a buffer of ${buf.length}`);
  const n = Number(fn.pread(fd, buf, length, offset));
  return n >= 0 ? n : -koffi.errno();
}

/**
 * send(2) of buf[0, length) on a stream socket, never blocking and never raising SIGPIPE: the count
 * sent, or -errno (EAGAIN: its send buffer is full; EPIPE/ECONNRESET: the peer is gone).
 */
export function sendNow(fd: number, buf: Buffer, length: number): number {
  if (length > buf.length) throw new RangeError(`send: ${length} bytes exceed a buffer of ${buf.length}`);
  const n = Number(fn.send(fd, buf, length, MSG_NOSIGNAL | MSG_DONTWAIT));
  return n >= 0 ? n : -koffi.errno();
}

/** recv(2) into buf, never blocking: the count received, or -errno (EAGAIN: nothing queued). */
export function recvNow(fd: number, buf: Buffer): number {
  const n = Number(fn.recv(fd, buf, buf.length, MSG_DONTWAIT));
  return n >= 0 ? n : -koffi.errno();
}

/** socket(2) with SOCK_CLOEXEC: the fd; throws (errno named, the call as `call` says it) when it cannot be made. */
export function openSocket(domain: number, type: number, protocol: number, call = `socket(${domain}, ${type}, ${protocol})`): number {
  const fd = fn.socket(domain, type | SOCK_CLOEXEC, protocol) as number;
  if (fd < 0) throw errnoError(call);
  return fd;
}

const timespec = Buffer.alloc(16);
const CLOCK_REALTIME = 0;

/** CLOCK_REALTIME now, ns since the epoch (full resolution, unlike Date.now()). */
export function realtimeNs(): bigint {
  if (fn.clock_gettime(CLOCK_REALTIME, timespec) !== 0) throw errnoError('clock_gettime(CLOCK_REALTIME)');
  return timespec.readBigInt64LE(0) * 1_000_000_000n + timespec.readBigInt64LE(8);
}
/** CPUCLOCK_SCHED of a process clock (include/linux/posix-timers.h): the scheduler's run time, in ns. */
const CPUCLOCK_SCHED = 2;

/**
 * CPU time of a whole process (every thread, live and exited), in ns: clock_gettime of its process
 * CPU clock (MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED), what clock_getcpuclockid gives), which the
 * kernel sums from each thread's sum_exec_runtime. Any process may read any other's. -1n when it
 * cannot be read (no such process).
 */
export function processCpuTimeNs(pid: number): bigint {
  if (fn.clock_gettime((~pid << 3) | CPUCLOCK_SCHED, timespec) !== 0) return -1n;
  return timespec.readBigInt64LE(0) * 1_000_000_000n + timespec.readBigInt64LE(8);
}

/** CLOCK_THREAD_CPUTIME_ID: the calling thread's run time. */
const CLOCK_THREAD_CPUTIME_ID = 3;

/** CPU time of the calling thread, in ns (what it ran, not what it waited: for measures on a busy host). */
export function threadCpuTimeNs(): bigint {
  if (fn.clock_gettime(CLOCK_THREAD_CPUTIME_ID, timespec) !== 0) throw errnoError('clock_gettime(CLOCK_THREAD_CPUTIME_ID)');
  return timespec.readBigInt64LE(0) * 1_000_000_000n + timespec.readBigInt64LE(8);
}

export interface PeerCredentials {
  pid: number;
  uid: number;
  gid: number;
  /**
   * The start time (/proc/<pid>/stat field 22) of the process that connected, read at accept: with the
   * pid it names that very process, which the connection can outlive (its pid then reused by another).
   * null: it was gone by then; absent: not read (a client's view of its peer).
   */
  starttime?: number | null;
}

/** SO_PEERCRED of a connected AF_UNIX socket: the peer's pid/uid/gid at connect() time. */
export function getPeerCredentials(fd: number): PeerCredentials {
  const cred = Buffer.alloc(12);
  const len = Buffer.alloc(4);
  len.writeUInt32LE(12, 0);
  if (fn.getsockopt(fd, SOL_SOCKET, SO_PEERCRED, cred, len) !== 0) throw errnoError('getsockopt(SO_PEERCRED)');
  return { pid: cred.readInt32LE(0), uid: cred.readUInt32LE(4), gid: cred.readUInt32LE(8) };
}

/** getsockopt option: a pidfd of the process that called connect() (Linux 6.5+). */
const SO_PEERPIDFD = 77;
const SYS_PIDFD_SEND_SIGNAL = 424;

/**
 * A pidfd (close-on-exec) of the very process that connected on the AF_UNIX socket `fd`, taken by
 * the kernel at connect(): it never names another process, whatever happens to the pid. -errno when
 * the kernel has none to give (ENOPROTOOPT before Linux 6.5, ESRCH when that process is gone).
 */
export function peerPidfd(fd: number): number {
  const v = Buffer.alloc(4);
  const len = Buffer.alloc(4);
  len.writeUInt32LE(4, 0);
  if (fn.getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, v, len) !== 0) return -koffi.errno();
  return v.readInt32LE(0);
}

/**
 * Whether the process of `pidfd` still runs (pidfd_send_signal with signal 0: checks, sends nothing).
 * EPERM says it runs as a user this process may not signal (a QEMU of another uid): alive all the same.
 */
export function pidfdAlive(pidfd: number): boolean {
  if (Number(fn.syscall(SYS_PIDFD_SEND_SIGNAL, 'int', pidfd, 'int', 0, 'void *', null, 'unsigned int', 0)) === 0) return true;
  return koffi.errno() === os.constants.errno.EPERM;
}

const SYS_PIDFD_OPEN = 434;
/** pidfd_open's flag for a pidfd of one thread (Linux 6.9+; the value of O_EXCL). */
const PIDFD_THREAD = 0o200;

/**
 * A pidfd (close-on-exec, as every pidfd) of thread `tid` alone (PIDFD_THREAD, Linux 6.9+): it turns
 * readable when that thread exits, and never names another thread. -errno (ESRCH: no such thread;
 * EINVAL: a kernel without PIDFD_THREAD; EMFILE: out of fds).
 */
export function pidfdOpenThread(tid: number): number {
  const fd = Number(fn.syscall(SYS_PIDFD_OPEN, 'int', tid, 'unsigned int', PIDFD_THREAD));
  return fd >= 0 ? fd : -koffi.errno();
}

const EPOLL_CLOEXEC = 0o2000000;
const EPOLL_CTL_ADD = 1;
const EPOLLIN = 1;
/** x86_64's struct epoll_event is packed: u32 events, u64 data. */
const EPOLL_EVENT_SIZE = 12;
const epollEvent = Buffer.alloc(EPOLL_EVENT_SIZE);

/** A new epoll set (close-on-exec): its fd, or -errno. */
export function epollCreate(): number {
  const fd = fn.epoll_create1(EPOLL_CLOEXEC) as number;
  return fd >= 0 ? fd : -koffi.errno();
}

/** Watches `fd` for reading in the set `epfd`, with `data` (a u32) handed back when it is ready: 0, or -errno. */
export function epollAdd(epfd: number, fd: number, data: number): number {
  epollEvent.writeUInt32LE(EPOLLIN, 0);
  epollEvent.writeBigUInt64LE(BigInt(data >>> 0), 4);
  return (fn.epoll_ctl(epfd, EPOLL_CTL_ADD, fd, epollEvent) as number) === 0 ? 0 : -koffi.errno();
}

/**
 * The data of the fds of `epfd` ready now, at most `buf.length / 12` (epoll_wait with a zero
 * timeout: never blocks); -errno as the only element when it fails.
 */
export function epollReadyNow(epfd: number, buf: Buffer): number[] {
  const n = fn.epoll_wait(epfd, buf, Math.floor(buf.length / EPOLL_EVENT_SIZE), 0) as number;
  if (n < 0) return [-koffi.errno()];
  const out: number[] = [];
  for (let i = 0; i < n; i++) out.push(Number(buf.readBigUInt64LE(i * EPOLL_EVENT_SIZE + 4)));
  return out;
}

/** sun_path is 108 bytes: a path needs one for its terminating NUL, an abstract name one for its leading NUL. */
export const MAX_UNIX_PATH_BYTES = 107;

/** sockaddr_un for a path, or an abstract name when it starts with '@' (leading NUL, no terminator). */
export function sockaddrUn(name: string): { addr: Buffer; len: number } {
  const abstract = name.startsWith('@');
  const bytes = Buffer.from(abstract ? name.slice(1) : name, 'utf8');
  const max = MAX_UNIX_PATH_BYTES;
  if (bytes.length > max) throw new Error(`unix socket address too long (${bytes.length} bytes, at most ${max}): ${name}`);
  const addr = Buffer.alloc(110);
  addr.writeUInt16LE(AF_UNIX, 0);
  bytes.copy(addr, abstract ? 3 : 2);
  return { addr, len: abstract ? 3 + bytes.length : 2 + bytes.length + 1 };
}

/** One AF_UNIX datagram to `name` (a path or '@abstract'), from a fresh socket closed right after. */
export function sendUnixDatagram(name: string, payload: Buffer): void {
  const { addr, len } = sockaddrUn(name);
  const fd = openSocket(AF_UNIX, SOCK_DGRAM, 0, 'socket(AF_UNIX, SOCK_DGRAM)');
  try {
    const n = Number(fn.sendto(fd, payload, payload.length, MSG_NOSIGNAL, addr, len));
    if (n < 0) throw errnoError(`sendto(${name})`);
  } finally {
    fn.close(fd);
  }
}

/** Capability sets of the calling thread as 64-bit masks. */
interface CapabilitySets {
  effective: bigint;
  permitted: bigint;
  inheritable: bigint;
}

function capHeader(): Buffer {
  const hdr = Buffer.alloc(8);
  hdr.writeUInt32LE(LINUX_CAPABILITY_VERSION_3, 0);
  hdr.writeInt32LE(0, 4);
  return hdr;
}

export function capget(): CapabilitySets {
  const data = Buffer.alloc(24);
  if (fn.capget(capHeader(), data) !== 0) throw errnoError('capget');
  const join = (lo: number, hi: number) => (BigInt(data.readUInt32LE(hi)) << 32n) | BigInt(data.readUInt32LE(lo));
  return { effective: join(0, 12), permitted: join(4, 16), inheritable: join(8, 20) };
}

/** capset for the calling thread only: Linux capabilities are per thread. */
export function capset(sets: CapabilitySets): void {
  const data = Buffer.alloc(24);
  const lo = (v: bigint) => Number(v & 0xffffffffn);
  const hi = (v: bigint) => Number((v >> 32n) & 0xffffffffn);
  data.writeUInt32LE(lo(sets.effective), 0);
  data.writeUInt32LE(lo(sets.permitted), 4);
  data.writeUInt32LE(lo(sets.inheritable), 8);
  data.writeUInt32LE(hi(sets.effective), 12);
  data.writeUInt32LE(hi(sets.permitted), 16);
  data.writeUInt32LE(hi(sets.inheritable), 20);
  if (fn.capset(capHeader(), data) !== 0) throw errnoError('capset');
}

export function prctl(option: number, arg2 = 0, arg3 = 0, arg4 = 0, arg5 = 0): number {
  const r = fn.prctl(option, arg2, arg3, arg4, arg5) as number;
  if (r < 0) throw errnoError(`prctl(${option})`);
  return r;
}

/** prctl(PR_SET_NAME): the calling thread's name (comm), cut to 15 bytes by the kernel. */
export function setThreadName(name: string): void {
  if ((fn.prctlName(15, name, 0, 0, 0) as number) < 0) throw errnoError('prctl(PR_SET_NAME)');
}

/** glibc broadcasts set*id to every thread of the process, so these change the whole process. */
export function setresuid(uid: number): void {
  if (fn.setresuid(uid, uid, uid) !== 0) throw errnoError(`setresuid(${uid})`);
}

export function setresgid(gid: number): void {
  if (fn.setresgid(gid, gid, gid) !== 0) throw errnoError(`setresgid(${gid})`);
}

export function setgroups(gids: readonly number[]): void {
  const list = Buffer.alloc(Math.max(4, gids.length * 4));
  gids.forEach((g, i) => list.writeUInt32LE(g, i * 4));
  if (fn.setgroups(gids.length, list) !== 0) throw errnoError('setgroups');
}

function sysconf(name: number): number {
  const v = Number(fn.sysconf(name));
  if (v < 0) throw errnoError(`sysconf(${name})`);
  return v;
}

export function clockTicksPerSecond(): number {
  return sysconf(SC_CLK_TCK);
}

export function gettid(): number {
  return fn.gettid() as number;
}

const F_GETFD = 1;
const F_SETFD = 2;
const FD_CLOEXEC = 1;
const F_DUPFD_CLOEXEC = 1030;

/** A second fd for the file description of `fd` (close-on-exec), or -errno (EMFILE when out of fds). */
export function dupCloexec(fd: number): number {
  const n = fn.fcntl(fd, F_DUPFD_CLOEXEC, 'int', 0) as number;
  return n >= 0 ? n : -koffi.errno();
}

/** Makes `newfd` a copy of `oldfd` (closing what `newfd` was); the copy survives execve. Throws with errno. */
export function dup2(oldfd: number, newfd: number): void {
  if ((fn.dup2(oldfd, newfd) as number) < 0) throw errnoError(`dup2(${oldfd}, ${newfd})`);
}

/** Lets `fd` survive execve. Node opens everything close-on-exec, its own stdio included. */
export function keepAcrossExec(fd: number): void {
  const flags = fn.fcntl(fd, F_GETFD) as number;
  if (flags < 0) throw errnoError(`fcntl(${fd}, F_GETFD)`);
  if ((flags & FD_CLOEXEC) !== 0 && (fn.fcntl(fd, F_SETFD, 'int', flags & ~FD_CLOEXEC) as number) < 0)
    throw errnoError(`fcntl(${fd}, F_SETFD)`);
}

/** Makes `fd` close-on-exec again (undoes keepAcrossExec after an exec that failed). */
export function closeOnExec(fd: number): void {
  const flags = fn.fcntl(fd, F_GETFD) as number;
  if (flags < 0) throw errnoError(`fcntl(${fd}, F_GETFD)`);
  if ((flags & FD_CLOEXEC) === 0 && (fn.fcntl(fd, F_SETFD, 'int', flags | FD_CLOEXEC) as number) < 0)
    throw errnoError(`fcntl(${fd}, F_SETFD)`);
}

/**
 * Replaces the whole process (every thread) with `path`; the pid, the environment given and the fds
 * without FD_CLOEXEC carry over (see keepAcrossExec). Returns only by throwing.
 */
export function execve(path: string, argv: readonly string[], env: NodeJS.ProcessEnv): never {
  const envp = Object.entries(env)
    .filter((e): e is [string, string] => e[1] !== undefined)
    .map(([k, v]) => `${k}=${v}`);
  fn.execve(path, [...argv, null], [...envp, null]);
  throw errnoError(`execve(${path})`);
}

/**
 * glibc's struct sigaction, large enough on x86_64 and aarch64 (handler 8, mask 128, flags 4 and
 * padding, restorer 8: 152 bytes); kept opaque: only the handler at offset 0 is ever written.
 */
const SIGACTION_BYTES = 256;
/** The handler value SIG_IGN. */
const SIG_IGN = 1n;

/**
 * Sets the action of signal `sig` to SIG_IGN at the C level, behind Node's back (a disposition of
 * SIG_IGN survives execve, a handler does not), and returns the previous action, opaque, for
 * restoreSignalAction. Throws with errno.
 */
export function ignoreSignal(sig: number): Buffer {
  const act = Buffer.alloc(SIGACTION_BYTES);
  act.writeBigUInt64LE(SIG_IGN, 0);
  const old = Buffer.alloc(SIGACTION_BYTES);
  if ((fn.sigaction(sig, act, old) as number) < 0) throw errnoError(`sigaction(${sig}, SIG_IGN)`);
  return old;
}

/** Puts back the action ignoreSignal returned (Node's own handler, or whatever it was). Throws with errno. */
export function restoreSignalAction(sig: number, old: Buffer): void {
  if ((fn.sigaction(sig, old, null) as number) < 0) throw errnoError(`sigaction(${sig})`);
}

/** alarm(2): SIGALRM in `seconds` (0: none), replacing the one pending; it survives execve. */
export function alarm(seconds: number): void {
  fn.alarm(seconds);
}

export const RLIMIT_NOFILE = 7;

export interface Rlimit {
  soft: number;
  hard: number;
}

/** RLIM_INFINITY (all ones) reads as Infinity. */
export function getrlimit(resource: number): Rlimit {
  const buf = Buffer.alloc(16);
  if (fn.getrlimit(resource, buf) !== 0) throw errnoError(`getrlimit(${resource})`);
  const v = (o: number) => {
    const x = buf.readBigUInt64LE(o);
    return x === 0xffffffffffffffffn ? Infinity : Number(x);
  };
  return { soft: v(0), hard: v(8) };
}

export function setrlimit(resource: number, l: Rlimit): void {
  const buf = Buffer.alloc(16);
  const w = (o: number, x: number) => buf.writeBigUInt64LE(x === Infinity ? 0xffffffffffffffffn : BigInt(x), o);
  w(0, l.soft);
  w(8, l.hard);
  if (fn.setrlimit(resource, buf) !== 0) throw errnoError(`setrlimit(${resource})`);
}

const POLLHUP = 0x10;
const POLLRDHUP = 0x2000;

/** Whether the peer of a stream socket has closed (or shut down writing), without reading from it. */
export function peerHungUp(fd: number): boolean {
  const pfd = Buffer.alloc(8);
  pfd.writeInt32LE(fd, 0);
  pfd.writeInt16LE(POLLRDHUP, 4);
  if ((fn.poll(pfd, 1, 0) as number) <= 0) return false;
  return (pfd.readInt16LE(6) & (POLLRDHUP | POLLHUP)) !== 0;
}

/** Gives free heap memory back to the kernel (glibc malloc_trim(0)). */
export function mallocTrim(): void {
  fn.malloc_trim(0);
}

const MADV_DONTNEED = 4;

/**
 * madvise(MADV_DONTNEED) on [start, end) of this process's address space: its pages leave the page
 * tables. Only for clean file-backed pages (mapped-files.ts decides which), which the next access
 * maps again from the page cache; on anonymous or copied-on-write pages it would lose their contents.
 */
export function dropMappedPages(start: bigint, end: bigint): void {
  if ((fn.madvise(start, end - start, MADV_DONTNEED) as number) !== 0) throw errnoError('madvise(MADV_DONTNEED)');
}

// ---- fds over AF_UNIX sockets (SCM_RIGHTS) ----

const SCM_RIGHTS = 1;
const MSG_TRUNC = 0x20;
const MSG_CTRUNC = 0x8;
const MSG_CMSG_CLOEXEC = 0x40000000;
/** sizeof(struct cmsghdr) on x86_64: size_t cmsg_len, int cmsg_level, int cmsg_type. */
const CMSGHDR_SIZE = 16;
/** Most fds one message may carry (SCM_MAX_FD, include/net/scm.h): the kernel refuses more with EINVAL. */
export const MAX_FDS_PER_MESSAGE = 253;

/** CMSG_ALIGN: control data is aligned to sizeof(size_t), 8 on x86_64. */
function cmsgAlign(n: number): number {
  return (n + 7) & ~7;
}

/** CMSG_LEN(n * sizeof(int)): the cmsg_len of an SCM_RIGHTS message with n fds (no trailing padding). */
export function cmsgLenForFds(n: number): number {
  return CMSGHDR_SIZE + 4 * n;
}

/** CMSG_SPACE(n * sizeof(int)): the control buffer an SCM_RIGHTS message with n fds takes, padding included. */
export function cmsgSpaceForFds(n: number): number {
  return CMSGHDR_SIZE + cmsgAlign(4 * n);
}

/** The control buffer of one SCM_RIGHTS message carrying `fds`. */
export function encodeScmRights(fds: readonly number[]): Buffer {
  const c = Buffer.alloc(cmsgSpaceForFds(fds.length));
  c.writeBigUInt64LE(BigInt(cmsgLenForFds(fds.length)), 0);
  c.writeInt32LE(SOL_SOCKET, 8);
  c.writeInt32LE(SCM_RIGHTS, 12);
  fds.forEach((fd, i) => c.writeInt32LE(fd, CMSGHDR_SIZE + 4 * i));
  return c;
}

/**
 * The fds of every SCM_RIGHTS message in the first `length` bytes of a control buffer the kernel
 * filled (CMSG_FIRSTHDR/CMSG_NXTHDR). Any other message (SCM_CREDENTIALS) is skipped; a header that
 * does not fit ends the walk.
 */
export function decodeScmRights(control: Buffer, length: number): number[] {
  const fds: number[] = [];
  const end = Math.min(length, control.length);
  let off = 0;
  while (off + CMSGHDR_SIZE <= end) {
    const len = Number(control.readBigUInt64LE(off));
    if (len < CMSGHDR_SIZE || off + len > end) break;
    if (control.readInt32LE(off + 8) === SOL_SOCKET && control.readInt32LE(off + 12) === SCM_RIGHTS) {
      for (let p = off + CMSGHDR_SIZE; p + 4 <= off + len; p += 4) fds.push(control.readInt32LE(p));
    }
    off += cmsgAlign(len);
  }
  return fds;
}

const SO_TYPE = 3;

/** SO_TYPE of a socket: SOCK_STREAM, SOCK_DGRAM, ... */
export function socketType(fd: number): number {
  const v = Buffer.alloc(4);
  const len = Buffer.alloc(4);
  len.writeUInt32LE(4, 0);
  if (fn.getsockopt(fd, SOL_SOCKET, SO_TYPE, v, len) !== 0) throw errnoError('getsockopt(SO_TYPE)');
  return v.readInt32LE(0);
}

const SO_ACCEPTCONN = 30;

/** SO_ACCEPTCONN: whether the socket `fd` is listening (a connection is not). */
export function isListeningSocket(fd: number): boolean {
  const v = Buffer.alloc(4);
  const len = Buffer.alloc(4);
  len.writeUInt32LE(4, 0);
  if (fn.getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, v, len) !== 0) throw errnoError('getsockopt(SO_ACCEPTCONN)');
  return v.readInt32LE(0) !== 0;
}

function sendmsgError(call: string, errno: number): NodeJS.ErrnoException {
  const err = errnoError(call, errno);
  if (err.code === 'EAGAIN') err.message = `${call}: EAGAIN (the socket's send buffer is full; send again once it is writable)`;
  return err;
}

function sendmsgTo(
  fd: number,
  data: Buffer,
  fds: readonly number[],
  flags: number,
  addr: { addr: Buffer; len: number } | null,
  call: string,
): number {
  if (fds.length > MAX_FDS_PER_MESSAGE) throw new RangeError(`${call}: ${fds.length} fds, at most ${MAX_FDS_PER_MESSAGE} fit one message`);
  const control = fds.length > 0 ? encodeScmRights(fds) : null;
  const n = Number(
    fn.sendmsg(
      fd,
      {
        msg_name: addr?.addr ?? null,
        msg_namelen: addr?.len ?? 0,
        msg_iov: [{ iov_base: data, iov_len: data.length }],
        msg_iovlen: 1,
        msg_control: control,
        msg_controllen: control?.length ?? 0,
        msg_flags: 0,
      },
      flags,
    ),
  );
  if (n < 0) throw sendmsgError(call, koffi.errno());
  return n;
}

/**
 * sendmsg(2) of `data` with `fds` attached (SCM_RIGHTS) on a connected AF_UNIX socket: the bytes sent,
 * which on a stream socket may be fewer than data.length (the fds went with the first byte; send the
 * rest without them). Throws an errno error; on EAGAIN (MSG_DONTWAIT given, or a non-blocking socket
 * whose buffer is full) its message says so. On a stream socket fds need at least one byte to ride
 * on (the kernel would drop them silently), so `data` may be empty there only without fds; a
 * datagram may carry fds alone. Never raises SIGPIPE.
 */
export function sendFds(fd: number, data: Buffer, fds: readonly number[], flags = 0): number {
  if (data.length === 0 && fds.length > 0 && socketType(fd) === SOCK_STREAM)
    throw new RangeError('sendmsg: on a stream socket fds need at least one byte of data to go with');
  return sendmsgTo(fd, data, fds, flags | MSG_NOSIGNAL, null, 'sendmsg');
}

/** One AF_UNIX datagram to `name` (a path or '@abstract') with `fds` attached, from a fresh socket closed right after. */
export function sendUnixDatagramWithFds(name: string, payload: Buffer, fds: readonly number[]): void {
  const addr = sockaddrUn(name);
  const fd = openSocket(AF_UNIX, SOCK_DGRAM, 0, 'socket(AF_UNIX, SOCK_DGRAM)');
  try {
    sendmsgTo(fd, payload, fds, MSG_NOSIGNAL, addr, `sendmsg(${name})`);
  } finally {
    fn.close(fd);
  }
}

interface ReceivedWithFds {
  /** The bytes read; empty at end of stream (or for an empty datagram). */
  data: Buffer;
  /** The fds that came with them, close-on-exec, now owned by the caller. */
  fds: number[];
  /**
   * More fds came than were allowed (the kernel closed the excess: MSG_CTRUNC), or a datagram was
   * longer than maxBytes (its tail is lost: MSG_TRUNC).
   */
  truncated: boolean;
}

/**
 * recvmsg(2) of up to `maxBytes` with at most `maxFds` fds (SCM_RIGHTS), the fds opened close-on-exec
 * (MSG_CMSG_CLOEXEC). The control buffer has room for maxFds fds only: the kernel closes the ones a
 * sender attached beyond that and reports MSG_CTRUNC (one more fits the alignment padding when
 * maxFds is odd: it is closed here), so a hostile sender cannot make this process hold more fds than
 * it asked for. Throws an errno error (EAGAIN: nothing to read on a non-blocking
 * socket or with MSG_DONTWAIT).
 */
export function recvWithFds(fd: number, maxBytes: number, maxFds: number, flags = 0): ReceivedWithFds {
  if (!Number.isInteger(maxBytes) || maxBytes < 0) throw new RangeError(`recvmsg: maxBytes ${maxBytes} is not a size`);
  if (!Number.isInteger(maxFds) || maxFds < 0 || maxFds > MAX_FDS_PER_MESSAGE)
    throw new RangeError(`recvmsg: maxFds ${maxFds} is not 0..${MAX_FDS_PER_MESSAGE}`);
  const data = Buffer.alloc(maxBytes);
  const control = Buffer.alloc(maxFds > 0 ? cmsgSpaceForFds(maxFds) : 0);
  const msg = {
    msg_name: null,
    msg_namelen: 0,
    msg_iov: [{ iov_base: data, iov_len: maxBytes }],
    msg_iovlen: 1,
    msg_control: maxFds > 0 ? control : null,
    msg_controllen: control.length,
    msg_flags: 0,
  };
  const n = Number(fn.recvmsg(fd, msg, flags | MSG_CMSG_CLOEXEC));
  if (n < 0) throw errnoError('recvmsg', koffi.errno());
  const fds = decodeScmRights(control, Number(msg.msg_controllen));
  // CMSG_SPACE pads to 8 bytes, so room for an odd number of fds holds one more: the kernel installs
  // it, and it is closed here. This process never holds more than maxFds from one call.
  const extra = fds.splice(maxFds);
  for (const fd of extra) fn.close(fd);
  const cut = (msg.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) !== 0 || extra.length > 0;
  return { data: data.subarray(0, n), fds, truncated: cut };
}

/** A connected pair of AF_UNIX sockets (SOCK_STREAM or SOCK_DGRAM), close-on-exec. */
export function socketpair(type: number = SOCK_STREAM): [number, number] {
  const sv = new Int32Array(2);
  if ((fn.socketpair(AF_UNIX, type | SOCK_CLOEXEC, 0, sv) as number) !== 0) throw errnoError('socketpair(AF_UNIX)');
  return [sv[0]!, sv[1]!];
}

/** close(2) of an fd this process owns; errors (EBADF) are ignored, as after close nothing is left to do. */
export function closeFd(fd: number): void {
  fn.close(fd);
}

// ---- memfd and seals ----

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

/** fcntl(F_ADD_SEALS): adds the F_SEAL_* bits in `seals`; EPERM once F_SEAL_SEAL is set, EBUSY for F_SEAL_WRITE over a writable mapping. */
export function addSeals(fd: number, seals: number): void {
  if ((fn.fcntl(fd, F_ADD_SEALS, 'int', seals) as number) < 0) throw errnoError(`fcntl(${fd}, F_ADD_SEALS)`);
}

/** fcntl(F_GET_SEALS): the F_SEAL_* bits of a memfd (EINVAL for a file that is not one and cannot be sealed). */
export function getSeals(fd: number): number {
  const seals = fn.fcntl(fd, F_GET_SEALS) as number;
  if (seals < 0) throw errnoError(`fcntl(${fd}, F_GET_SEALS)`);
  return seals;
}

/** Whether `fd` is close-on-exec (FD_CLOEXEC). */
export function isCloseOnExec(fd: number): boolean {
  const flags = fn.fcntl(fd, F_GETFD) as number;
  if (flags < 0) throw errnoError(`fcntl(${fd}, F_GETFD)`);
  return (flags & FD_CLOEXEC) !== 0;
}

/** A watch on an fd, from watchReadable. */
export interface FdWatch {
  close(): void;
}

/**
 * Calls `onReadable` from the event loop whenever `fd` has something to read (bytes, end of stream,
 * or an error a read will report): a libuv poll handle, through koffi. Level-triggered: it fires
 * again while something is left unread. Never an fd a net.Socket watches itself (libuv keeps one
 * watcher per fd number): give it a duplicate (dupCloexec).
 */
export function watchReadable(fd: number, onReadable: () => void): FdWatch {
  const handle = koffi.node.poll(fd, { readable: true, disconnect: true }, () => onReadable());
  return { close: () => handle.close() };
}

// ---- shared mappings ----

const PROT_READ = 0x1;
const PROT_WRITE = 0x2;
const MAP_SHARED = 0x1;
const MAP_FAILED = 0xffffffffffffffffn;

/** A MAP_SHARED mapping of a file: its bytes as an ArrayBuffer (valid until unmap()). */
export interface SharedMapping {
  /** The mapped bytes; stores go to the file. Never touched after unmap(): the pages are gone. */
  readonly memory: ArrayBuffer;
  readonly length: number;
  /** munmap(2); a second call does nothing. */
  unmap(): void;
}

/**
 * mmap(2) of the first `length` bytes of `fd`, MAP_SHARED, readable (and writable when `writable`):
 * stores into `memory` are the file's contents for every other reader of it at once, without a
 * syscall. The mapping outlives the fd (close it or keep it); unmap() ends it.
 */
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

// ---- paths relative to a directory fd (guest-dir/: nothing followed) ----

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
  const fd = fn.openat(dirFd, name, flags | O_CLOEXEC, mode) as number;
  return fd >= 0 ? fd : -koffi.errno();
}

/** mkdirat(2): 0, or -errno (EEXIST when the name is taken, by anything). */
export function mkdirAt(dirFd: number, name: string, mode: number): number {
  return (fn.mkdirat(dirFd, name, mode) as number) === 0 ? 0 : -koffi.errno();
}

/** renameat(2) of `from` to `to`, both in `dirFd`: replaces `to` at once (a reader opens the old file or the new one). 0 or -errno. */
export function renameAt(dirFd: number, from: string, to: string): number {
  return (fn.renameat(dirFd, from, dirFd, to) as number) === 0 ? 0 : -koffi.errno();
}

const RENAME_EXCHANGE = 2;

/**
 * renameat2(2) with RENAME_EXCHANGE of `a` and `b`, both in `dirFd`: each name now holds the other's
 * file, at once (a reader opens one file or the other, never neither). 0 or -errno (EINVAL where the
 * file system cannot exchange).
 */
export function exchangeAt(dirFd: number, a: string, b: string): number {
  return (fn.renameat2(dirFd, a, dirFd, b, RENAME_EXCHANGE) as number) === 0 ? 0 : -koffi.errno();
}

const F_SETSIG = 10;
const F_SETLEASE = 1024;
const F_WRLCK = 1;
const F_UNLCK = 2;
/** SIGURG: ignored unless handled. */
const LEASE_BREAK_SIGNAL = 23;

/**
 * fcntl(F_SETSIG, SIGURG) on `fd`, once before takeWriteLease: a lease on it broken by an opener is
 * then signalled with SIGURG, ignored unless handled, not SIGIO, whose default ends the process. 0 or -errno.
 */
export function signalLeaseBreaks(fd: number): number {
  return (fn.fcntl(fd, F_SETSIG, 'int', LEASE_BREAK_SIGNAL) as number) === 0 ? 0 : -koffi.errno();
}

/**
 * fcntl(F_SETLEASE, F_WRLCK) on `fd` (signalLeaseBreaks called on it first): 0 once the process holds
 * a write lease on its file, which the kernel grants only while no other open file (any process's, a
 * mapping's) refers to it; -EAGAIN when one does; another -errno where leases cannot be had
 * (leases-enable 0, a file system without them). While it is held, an open of the file waits
 * (EWOULDBLOCK with O_NONBLOCK) until the lease goes.
 */
export function takeWriteLease(fd: number): number {
  return (fn.fcntl(fd, F_SETLEASE, 'int', F_WRLCK) as number) === 0 ? 0 : -koffi.errno();
}

/** fcntl(F_SETLEASE, F_UNLCK): the lease of takeWriteLease let go. 0 or -errno. */
export function dropLease(fd: number): number {
  return (fn.fcntl(fd, F_SETLEASE, 'int', F_UNLCK) as number) === 0 ? 0 : -koffi.errno();
}

/** pwrite(2) of buf[0, length) at `offset`: the count written, or -errno. */
export function pwriteFd(fd: number, buf: Buffer, length: number, offset: number): number {
  if (length > buf.length) throw new RangeError(`pwrite: ${length} bytes exceed a buffer of ${buf.length}`);
  const n = Number(fn.pwrite(fd, buf, length, offset));
  return n >= 0 ? n : -koffi.errno();
}

/** ftruncate(2): 0 or -errno. */
export function truncateFd(fd: number, length: number): number {
  return (fn.ftruncate(fd, length) as number) === 0 ? 0 : -koffi.errno();
}

/** unlinkat(2) (flag 0x200, AT_REMOVEDIR, for an empty directory): 0 or -errno. Removes a symlink itself, never what it names. */
export function unlinkAt(dirFd: number, name: string, flags = 0): number {
  return (fn.unlinkat(dirFd, name, flags) as number) === 0 ? 0 : -koffi.errno();
}

/** symlinkat(2): a symlink `name` in `dirFd` holding `target` (never resolved here). 0 or -errno. */
export function symlinkAt(target: string, dirFd: number, name: string): number {
  return (fn.symlinkat(target, dirFd, name) as number) === 0 ? 0 : -koffi.errno();
}

const linkBuf = Buffer.alloc(4096);

/** readlinkat(2): the target a symlink holds, or -errno (EINVAL: not a symlink). */
export function readlinkAt(dirFd: number, name: string): string | number {
  const n = Number(fn.readlinkat(dirFd, name, linkBuf, linkBuf.length));
  return n >= 0 ? linkBuf.toString('utf8', 0, n) : -koffi.errno();
}

/** write(2) of buf[0, length): the count written, or -errno. */
export function writeFd(fd: number, buf: Buffer, length: number): number {
  if (length > buf.length) throw new RangeError(`write: ${length} bytes exceed a buffer of ${buf.length}`);
  const n = Number(fn.write(fd, buf, length));
  return n >= 0 ? n : -koffi.errno();
}

/** fchmod(2): 0 or -errno. */
export function fchmodFd(fd: number, mode: number): number {
  return (fn.fchmod(fd, mode) as number) === 0 ? 0 : -koffi.errno();
}

/** fsetxattr(2) of `name` to `value`: 0 or -errno. */
export function fsetxattrFd(fd: number, name: string, value: Buffer): number {
  return (fn.fsetxattr(fd, name, value, value.length, 0) as number) === 0 ? 0 : -koffi.errno();
}

/** Bytes of x86_64's struct stat (asm/stat.h): the buffer fstatRaw fills. */
export const STAT_SIZE = 144;
/** Where st_atim lies in it (16 bytes: seconds, then nanoseconds). */
export const STAT_ATIME_AT = 72;

/**
 * fstat(2) into `buf` (at least STAT_SIZE bytes) as the kernel lays it out, without making a Stats
 * object: 0 or -errno. For a check that runs for many fds each sample (guest-dir/): Node's fstatSync
 * makes an object of BigInts each call, several microseconds.
 */
export function fstatRaw(fd: number, buf: Buffer): number {
  if (buf.length < STAT_SIZE) throw new RangeError(`fstat: a buffer of ${buf.length} bytes is under ${STAT_SIZE}`);
  return (fn.fstat(fd, buf) as number) === 0 ? 0 : -koffi.errno();
}

// ---- inotify ----

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
  const fd = fn.inotify_init1(O_NONBLOCK | O_CLOEXEC) as number;
  return fd >= 0 ? fd : -koffi.errno();
}

/**
 * inotify_add_watch(2) of the directory open as `dirFd` (through /proc/self/fd, which names that
 * open directory itself, never a path looked up again): a watch descriptor, or -errno (ENOSPC: the
 * user's max_user_watches reached).
 */
export function inotifyWatchFd(inotifyFd: number, dirFd: number, mask: number): number {
  const wd = fn.inotify_add_watch(inotifyFd, `/proc/self/fd/${dirFd}`, mask | IN_ONLYDIR) as number;
  return wd >= 0 ? wd : -koffi.errno();
}

/** inotify_rm_watch(2): 0 or -errno. */
export function inotifyUnwatch(inotifyFd: number, wd: number): number {
  return (fn.inotify_rm_watch(inotifyFd, wd) as number) === 0 ? 0 : -koffi.errno();
}

/** read(2) into buf[0, length): the count read, or -errno (EAGAIN: nothing to read on a non-blocking fd). */
export function readFd(fd: number, buf: Buffer, length: number): number {
  if (length > buf.length) throw new RangeError(`read: ${length} bytes exceed a buffer of ${buf.length}`);
  const n = Number(fn.read(fd, buf, length));
  return n >= 0 ? n : -koffi.errno();
}
