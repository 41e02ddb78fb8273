/** Socket calls Node does not expose: non-blocking send/recv, peer credentials and pidfd, Unix datagrams, SCM_RIGHTS, socketpair. */
import type net from 'node:net';
import koffi from 'koffi';
import { checkLength, errnoError, libc, orErrno } from './errno.js';
import { closeFd } from './fds.js';

/** x86_64's iovec and msghdr (anonymous koffi types: this module may be loaded twice in a process). */
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

/** The fd under a net.Socket (libuv handle); undefined once closed or for non-fd handles. */
export function socketFd(socket: net.Socket): number | undefined {
  const fd = (socket as unknown as { _handle?: { fd?: unknown } })._handle?.fd;
  return typeof fd === 'number' && fd >= 0 ? fd : undefined;
}

const fn = {
  getsockopt: libc.func('int getsockopt(int fd, int level, int optname, void *optval, void *optlen)'),
  socket: libc.func('int socket(int domain, int type, int protocol)'),
  send: libc.func('long send(int fd, const void *buf, size_t len, int flags)'),
  recv: libc.func('long recv(int fd, void *buf, size_t len, int flags)'),
  poll: libc.func('int poll(void *fds, unsigned long nfds, int timeout)'),
  sendmsg: libc.func('sendmsg', 'long', ['int', koffi.pointer(msghdrType), 'int']),
  recvmsg: libc.func('recvmsg', 'long', ['int', koffi.inout(koffi.pointer(msghdrType)), 'int']),
  socketpair: libc.func('int socketpair(int domain, int type, int protocol, _Out_ int *sv)'),
  accept4: libc.func('int accept4(int fd, void *addr, void *addrlen, int flags)'),
};

const SOL_SOCKET = 1;
const SO_PEERCRED = 17;
export const AF_UNIX = 1;
export const SOCK_DGRAM = 2;
export const SOCK_CLOEXEC = 0o2000000;
const MSG_NOSIGNAL = 0x4000;
export const MSG_DONTWAIT = 0x40;
export const SOCK_STREAM = 1;
export const SOCK_SEQPACKET = 5;

/** send(2) of buf[0, length), never blocking nor raising SIGPIPE: the count, or -errno (EAGAIN: buffer full; EPIPE/ECONNRESET). */
export function sendNow(fd: number, buf: Buffer, length: number): number {
  checkLength('send', buf, length);
  return orErrno(fn.send(fd, buf, length, MSG_NOSIGNAL | MSG_DONTWAIT));
}

/** recv(2) into buf, never blocking: the count received, or -errno (EAGAIN: nothing queued). */
export function recvNow(fd: number, buf: Buffer): number {
  return orErrno(fn.recv(fd, buf, buf.length, MSG_DONTWAIT));
}

const SOCK_NONBLOCK = 0o4000;
/** accept4(2) on a listening socket, never blocking: the connection's fd (close-on-exec, non-blocking), or -errno (EAGAIN: none waits). */
export function acceptNow(fd: number): number {
  return orErrno(fn.accept4(fd, null, null, SOCK_CLOEXEC | SOCK_NONBLOCK));
}

/** socket(2) with SOCK_CLOEXEC: the fd; throws (errno named, the call as `call` says it) when it cannot be made. */
export function openSocket(domain: number, type: number, protocol: number, call = `socket(${domain}, ${type}, ${protocol})`): number {
  const fd = fn.socket(domain, type | SOCK_CLOEXEC, protocol) as number;
  if (fd < 0) throw errnoError(call);
  return fd;
}

export interface PeerCredentials {
  pid: number;
  uid: number;
  gid: number;
  /** Stat field 22 of the process that connected, read at accept (with the pid, it names that process); null: gone by then. */
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

const SO_PEERPIDFD = 77;
/** A pidfd of the very process that connected on `fd`, taken at connect(); -errno (ENOPROTOOPT before Linux 6.5, ESRCH: gone). */
export function peerPidfd(fd: number): number {
  return intOption(fd, SO_PEERPIDFD) ?? -koffi.errno();
}

/** An int SOL_SOCKET option of `fd`; null when getsockopt fails (errno says why), or with `name` it throws. */
function intOption(fd: number, option: number, name?: string): number | null {
  const v = Buffer.alloc(4);
  const len = Buffer.alloc(4);
  len.writeUInt32LE(4, 0);
  if (fn.getsockopt(fd, SOL_SOCKET, option, v, len) === 0) return v.readInt32LE(0);
  if (name !== undefined) throw errnoError(`getsockopt(${name})`);
  return null;
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

const SCM_RIGHTS = 1;
const MSG_TRUNC = 0x20;
const MSG_CTRUNC = 0x8;
const MSG_CMSG_CLOEXEC = 0x40000000;
/** sizeof(struct cmsghdr) on x86_64: size_t cmsg_len, int cmsg_level, int cmsg_type. */
const CMSGHDR_SIZE = 16;
/** SCM_MAX_FD (include/net/scm.h): the kernel refuses more with EINVAL. */
export const MAX_FDS_PER_MESSAGE = 253;

/** CMSG_ALIGN: to sizeof(size_t), 8 on x86_64. */
function cmsgAlign(n: number): number {
  return (n + 7) & ~7;
}

/** CMSG_LEN(n * sizeof(int)). */
export function cmsgLenForFds(n: number): number {
  return CMSGHDR_SIZE + 4 * n;
}

/** CMSG_SPACE(n * sizeof(int)): padding included. */
export function cmsgSpaceForFds(n: number): number {
  return CMSGHDR_SIZE + cmsgAlign(4 * n);
}

export function encodeScmRights(fds: readonly number[]): Buffer {
  const c = Buffer.alloc(cmsgSpaceForFds(fds.length));
  c.writeBigUInt64LE(BigInt(cmsgLenForFds(fds.length)), 0);
  c.writeInt32LE(SOL_SOCKET, 8);
  c.writeInt32LE(SCM_RIGHTS, 12);
  fds.forEach((fd, i) => c.writeInt32LE(fd, CMSGHDR_SIZE + 4 * i));
  return c;
}

/** The fds of every SCM_RIGHTS message in control[0, length); other messages skipped, a header that does not fit ends the walk. */
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
const SO_ACCEPTCONN = 30;

export const socketType = (fd: number): number => intOption(fd, SO_TYPE, 'SO_TYPE')!;
export const isListeningSocket = (fd: number): boolean => intOption(fd, SO_ACCEPTCONN, 'SO_ACCEPTCONN') !== 0;

/** A msghdr of one iovec over all of `data`, with `control` (when not null) and `addr` (when given). */
function msghdr(data: Buffer, control: Buffer | null, addr?: { addr: Buffer; len: number }) {
  return {
    msg_name: addr?.addr ?? null,
    msg_namelen: addr?.len ?? 0,
    msg_iov: [{ iov_base: data, iov_len: data.length }],
    msg_iovlen: 1,
    msg_control: control,
    msg_controllen: control?.length ?? 0,
    msg_flags: 0,
  };
}

function sendmsgTo(
  fd: number,
  data: Buffer,
  fds: readonly number[],
  flags: number,
  call: string,
  addr?: { addr: Buffer; len: number },
): number {
  if (fds.length > MAX_FDS_PER_MESSAGE) throw new RangeError(`${call}: ${fds.length} fds, at most ${MAX_FDS_PER_MESSAGE} fit one message`);
  const n = Number(fn.sendmsg(fd, msghdr(data, fds.length > 0 ? encodeScmRights(fds) : null, addr), flags));
  if (n >= 0) return n;
  const err = errnoError(call);
  if (err.code === 'EAGAIN') err.message = `${call}: EAGAIN (the socket's send buffer is full; send again once it is writable)`;
  throw err;
}

/**
 * sendmsg(2) of `data` with `fds` on a connected AF_UNIX socket, no SIGPIPE: the bytes sent (a stream's maybe fewer, the fds
 * with the first). On a stream socket fds need a byte to ride on (else dropped silently); a datagram may carry fds alone.
 */
export function sendFds(fd: number, data: Buffer, fds: readonly number[], flags = 0): number {
  if (data.length === 0 && fds.length > 0 && socketType(fd) === SOCK_STREAM)
    throw new RangeError('sendmsg: on a stream socket fds need at least one byte of data to go with');
  return sendmsgTo(fd, data, fds, flags | MSG_NOSIGNAL, 'sendmsg');
}

/** One AF_UNIX datagram to `name` (a path or '@abstract'), with `fds` attached, from a fresh socket closed right after. */
export function sendUnixDatagram(name: string, payload: Buffer, fds: readonly number[] = []): void {
  const addr = sockaddrUn(name);
  const fd = openSocket(AF_UNIX, SOCK_DGRAM, 0, 'socket(AF_UNIX, SOCK_DGRAM)');
  try {
    sendmsgTo(fd, payload, fds, MSG_NOSIGNAL, `${fds.length > 0 ? 'sendmsg' : 'sendto'}(${name})`, addr);
  } finally {
    closeFd(fd);
  }
}

interface ReceivedWithFds {
  /** Empty at end of stream (or for an empty datagram). */
  data: Buffer;
  /** Close-on-exec, owned by the caller. */
  fds: number[];
  /** More fds came than were allowed (MSG_CTRUNC), or a datagram was longer than maxBytes (MSG_TRUNC). */
  truncated: boolean;
}

/**
 * recvmsg(2) of up to `maxBytes` with at most `maxFds` fds (close-on-exec): the control buffer holds no
 * more, so a hostile sender's excess is closed by the kernel. Throws an errno error (EAGAIN: nothing to read).
 */
export function recvWithFds(fd: number, maxBytes: number, maxFds: number, flags = 0): ReceivedWithFds {
  if (!Number.isInteger(maxBytes) || maxBytes < 0) throw new RangeError(`recvmsg: maxBytes ${maxBytes} is not a size`);
  if (!Number.isInteger(maxFds) || maxFds < 0 || maxFds > MAX_FDS_PER_MESSAGE)
    throw new RangeError(`recvmsg: maxFds ${maxFds} is not 0..${MAX_FDS_PER_MESSAGE}`);
  const data = Buffer.alloc(maxBytes);
  const control = Buffer.alloc(maxFds > 0 ? cmsgSpaceForFds(maxFds) : 0);
  const msg = msghdr(data, maxFds > 0 ? control : null);
  const n = Number(fn.recvmsg(fd, msg, flags | MSG_CMSG_CLOEXEC));
  if (n < 0) throw errnoError('recvmsg');
  const fds = decodeScmRights(control, Number(msg.msg_controllen));
  // CMSG_SPACE pads to 8 bytes: room for an odd number of fds holds one more, installed, and closed here.
  const extra = fds.splice(maxFds);
  for (const fd of extra) closeFd(fd);
  const cut = (msg.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) !== 0 || extra.length > 0;
  return { data: data.subarray(0, n), fds, truncated: cut };
}

/** A connected pair of AF_UNIX sockets (SOCK_STREAM or SOCK_DGRAM), close-on-exec. */
export function socketpair(type: number = SOCK_STREAM): [number, number] {
  const sv = new Int32Array(2);
  if ((fn.socketpair(AF_UNIX, type | SOCK_CLOEXEC, 0, sv) as number) !== 0) throw errnoError('socketpair(AF_UNIX)');
  return [sv[0]!, sv[1]!];
}
