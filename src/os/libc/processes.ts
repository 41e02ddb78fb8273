/** Process and thread calls: clocks, pidfds, the tid, exec, signal actions, alarm, resource limits, the thread name. */
import os from 'node:os';
import koffi from 'koffi';
import { errnoError, libc, orErrno } from './errno.js';

const fn = {
  prctlName: libc.func('prctl', 'int', ['int', 'str', 'ulong', 'ulong', 'ulong']),
  sysconf: libc.func('long sysconf(int name)'),
  gettid: libc.func('int gettid()'),
  execve: libc.func('int execve(const char *path, const char **argv, const char **envp)'),
  sigaction: libc.func('int sigaction(int sig, const void *act, void *oldact)'),
  alarm: libc.func('unsigned int alarm(unsigned int seconds)'),
  getrlimit: libc.func('int getrlimit(int resource, void *rlim)'),
  clock_gettime: libc.func('int clock_gettime(int clk, void *ts)'),
  setrlimit: libc.func('int setrlimit(int resource, const void *rlim)'),
  syscall: libc.func('long syscall(long number, ...)'),
};

const SC_CLK_TCK = 2;
const timespec = Buffer.alloc(16);
const CLOCK_REALTIME = 0;

/** clock_gettime of `clock`, in ns; null when it fails (errno says why), or with `name` it throws. */
function clockNs(clock: number, name?: string): bigint | null {
  if (fn.clock_gettime(clock, timespec) === 0) return timespec.readBigInt64LE(0) * 1_000_000_000n + timespec.readBigInt64LE(8);
  if (name !== undefined) throw errnoError(`clock_gettime(${name})`);
  return null;
}

/** CLOCK_REALTIME now, ns since the epoch (full resolution, unlike Date.now()). */
export function realtimeNs(): bigint {
  return clockNs(CLOCK_REALTIME, 'CLOCK_REALTIME')!;
}

/** The scheduler's run time, ns (include/linux/posix-timers.h). */
const CPUCLOCK_SCHED = 2;

/** CPU time of a whole process (all threads, exited ones too), ns (MAKE_PROCESS_CPUCLOCK: anyone may read it); -1n: no such process. */
export function processCpuTimeNs(pid: number): bigint {
  return clockNs((~pid << 3) | CPUCLOCK_SCHED) ?? -1n;
}

const CLOCK_THREAD_CPUTIME_ID = 3;

/** CPU time of the calling thread, in ns (what it ran, not what it waited: for measures on a busy host). */
export function threadCpuTimeNs(): bigint {
  return clockNs(CLOCK_THREAD_CPUTIME_ID, 'CLOCK_THREAD_CPUTIME_ID')!;
}

const SYS_PIDFD_SEND_SIGNAL = 424;

/** Whether the process of `pidfd` still runs (pidfd_send_signal of signal 0); EPERM: one we may not signal, alive all the same. */
export function pidfdAlive(pidfd: number): boolean {
  if (Number(fn.syscall(SYS_PIDFD_SEND_SIGNAL, 'int', pidfd, 'int', 0, 'void *', null, 'unsigned int', 0)) === 0) return true;
  return koffi.errno() === os.constants.errno.EPERM;
}

const SYS_PIDFD_OPEN = 434;
/** pidfd_open's flag for a pidfd of one thread (Linux 6.9+; the value of O_EXCL). */
const PIDFD_THREAD = 0o200;

/** A pidfd of thread `tid` alone, readable when it exits; -errno (ESRCH: no such thread, EINVAL: no PIDFD_THREAD, EMFILE). */
export function pidfdOpenThread(tid: number): number {
  return orErrno(fn.syscall(SYS_PIDFD_OPEN, 'int', tid, 'unsigned int', PIDFD_THREAD));
}

/** prctl(PR_SET_NAME): the calling thread's name (comm), cut to 15 bytes by the kernel. */
export function setThreadName(name: string): void {
  if ((fn.prctlName(15, name, 0, 0, 0) as number) < 0) throw errnoError('prctl(PR_SET_NAME)');
}

export function clockTicksPerSecond(): number {
  const v = Number(fn.sysconf(SC_CLK_TCK));
  if (v < 0) throw errnoError(`sysconf(${SC_CLK_TCK})`);
  return v;
}

export function gettid(): number {
  return fn.gettid() as number;
}

/** Replaces the whole process with `path`: the pid, `env` and fds without FD_CLOEXEC carry over. Returns only by throwing. */
export function execve(path: string, argv: readonly string[], env: NodeJS.ProcessEnv): never {
  const envp = Object.entries(env)
    .filter((e): e is [string, string] => e[1] !== undefined)
    .map(([k, v]) => `${k}=${v}`);
  fn.execve(path, [...argv, null], [...envp, null]);
  throw errnoError(`execve(${path})`);
}

/** glibc's struct sigaction is 152 bytes on x86_64 and aarch64; opaque but for the handler at offset 0. */
const SIGACTION_BYTES = 256;
const SIG_IGN = 1n;

/** SIG_IGN for `sig` behind Node's back (it survives execve, a handler does not); returns the old action for restoreSignalAction. */
export function ignoreSignal(sig: number): Buffer {
  const act = Buffer.alloc(SIGACTION_BYTES);
  act.writeBigUInt64LE(SIG_IGN, 0);
  const old = Buffer.alloc(SIGACTION_BYTES);
  if ((fn.sigaction(sig, act, old) as number) < 0) throw errnoError(`sigaction(${sig}, SIG_IGN)`);
  return old;
}

export function restoreSignalAction(sig: number, old: Buffer): void {
  if ((fn.sigaction(sig, old, null) as number) < 0) throw errnoError(`sigaction(${sig})`);
}

/** alarm(2): SIGALRM in `seconds` (0: none), replacing the one pending; it survives execve. */
export function alarm(seconds: number): void {
  fn.alarm(seconds);
}

export const RLIMIT_NOFILE = 7;

interface Rlimit {
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
