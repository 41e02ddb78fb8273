/**
 * Which local user holds the other end of a TCP connection, by sock_diag (as `ss`): on loopback every user has the same
 * address. The kernel answers an exact lookup within the send, so the reply is read without waiting.
 */
import { ipv4Octets, ipv6Groups } from '../common/ip-address.js';
import { closeFd } from './libc/fds.js';
import { openSocket, recvNow, sendNow, SOCK_DGRAM } from './libc/sockets.js';

const AF_INET = 2;
const AF_INET6 = 10;
const AF_NETLINK = 16;
const NETLINK_SOCK_DIAG = 4;
const SOCK_DIAG_BY_FAMILY = 20;
const NLM_F_REQUEST = 1;
const NLMSG_ERROR = 2;
const IPPROTO_TCP = 6;
const TCP_LISTEN = 10;
const TCP_TIME_WAIT = 6;
/** nlmsghdr (16) + inet_diag_req_v2 (56). */
const REQUEST_BYTES = 72;
/** Offsets in the reply: nlmsghdr, then inet_diag_msg (state, its inet_diag_sockid, uid). */
const REPLY = { type: 4, seq: 8, state: 17, sport: 20, dport: 22, uid: 80, bytes: 88 } as const;
/** Replies of earlier lookups that came late are skipped, at most this many per lookup. */
const MAX_STALE_REPLIES = 8;

/** net.Socket's own fields, on the accepting side. */
interface TcpEnds {
  remoteAddress?: string;
  remotePort?: number;
  localAddress?: string;
  localPort?: number;
}

/** An address as sock_diag wants it: its family and 16 bytes (an IPv4-mapped IPv6 address is IPv4). */
function encodeAddress(address: string): { family: number; bytes: Buffer } | null {
  const bytes = Buffer.alloc(16);
  const v4 = ipv4Octets(address);
  if (v4) {
    v4.forEach((o, i) => (bytes[i] = o));
    return { family: AF_INET, bytes };
  }
  const v6 = ipv6Groups(address);
  if (v6 === null) return null;
  v6.forEach((g, i) => bytes.writeUInt16BE(parseInt(g, 16), 2 * i));
  return { family: AF_INET6, bytes };
}

/** The request for the socket whose own end is the connection's remote one. */
function encodeRequest(ends: Required<TcpEnds>, seq: number): Buffer | null {
  const peer = encodeAddress(ends.remoteAddress);
  const local = encodeAddress(ends.localAddress);
  if (peer === null || local === null || peer.family !== local.family) return null;
  const b = Buffer.alloc(REQUEST_BYTES);
  b.writeUInt32LE(REQUEST_BYTES, 0);
  b.writeUInt16LE(SOCK_DIAG_BY_FAMILY, 4);
  b.writeUInt16LE(NLM_F_REQUEST, 6);
  b.writeUInt32LE(seq, 8);
  b[16] = peer.family;
  b[17] = IPPROTO_TCP;
  b.writeUInt32LE(0xffffffff, 20);
  b.writeUInt16BE(ends.remotePort, 24);
  b.writeUInt16BE(ends.localPort, 26);
  peer.bytes.copy(b, 28);
  local.bytes.copy(b, 44);
  // No cookie (INET_DIAG_NOCOOKIE).
  b.writeUInt32LE(0xffffffff, 64);
  b.writeUInt32LE(0xffffffff, 68);
  return b;
}

/**
 * The uid in a reply, or null. With no connection matching, the kernel falls back to a listening socket on the peer's port
 * (a remote peer whose port a local service listens on): only a connected socket with the connection's ports counts.
 */
function decodeReply(r: Buffer, n: number, ends: Required<TcpEnds>): number | null {
  if (n < REPLY.bytes || r.readUInt16LE(REPLY.type) === NLMSG_ERROR) return null;
  const state = r[REPLY.state];
  if (state === TCP_LISTEN || state === TCP_TIME_WAIT) return null;
  if (r.readUInt16BE(REPLY.sport) !== ends.remotePort || r.readUInt16BE(REPLY.dport) !== ends.localPort) return null;
  return r.readUInt32LE(REPLY.uid);
}

export class TcpPeerUids {
  private fd: number | null = null;
  private seq = 0;
  private readonly reply = Buffer.alloc(512);

  /** The uid of the process that holds the connection's other end, when it is on this host; else null. */
  uidOf(ends: TcpEnds): number | null {
    const { remoteAddress, remotePort, localAddress, localPort } = ends;
    if (remoteAddress === undefined || remotePort === undefined || localAddress === undefined || localPort === undefined) return null;
    const all = { remoteAddress, remotePort, localAddress, localPort };
    const seq = (this.seq = (this.seq + 1) >>> 0);
    const req = encodeRequest(all, seq);
    if (req === null) return null;
    this.fd ??= openSocket(AF_NETLINK, SOCK_DGRAM, NETLINK_SOCK_DIAG, 'socket(AF_NETLINK, SOCK_DGRAM, NETLINK_SOCK_DIAG)');
    if (sendNow(this.fd, req, req.length) !== req.length) return null;
    for (let i = 0; i <= MAX_STALE_REPLIES; i++) {
      const n = recvNow(this.fd, this.reply);
      if (n < 0) return null;
      if (n >= 16 && this.reply.readUInt32LE(REPLY.seq) === seq) return decodeReply(this.reply, n, all);
    }
    return null;
  }

  close(): void {
    if (this.fd !== null) closeFd(this.fd);
    this.fd = null;
  }
}
