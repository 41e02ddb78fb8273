/**
 * What a request is answered with: one frame, and the file descriptors that go with it, if any
 * (SCM_RIGHTS, attached to the frame's first byte). A reply's fds stay the sender's: the connection
 * calls release() exactly once, when they went out (the kernel holds its own copies in the message)
 * or never will (the client is gone), and release() closes them. Whoever builds a reply with fds
 * (the handler that opened or duplicated them) closes them there, so no fd leaks on either path.
 */
import type net from 'node:net';

export interface Reply {
  readonly frame: Buffer;
  /** Sent with the frame in one sendmsg (SCM_RIGHTS); absent or empty = a plain write. */
  readonly fds?: readonly number[];
  /** Called once the fds went out or never will; closes them. */
  readonly release?: () => void;
}

/** A reply of one frame and no fds. */
export function frameReply(frame: Buffer): Reply {
  return { frame };
}

/**
 * Sends `frame` with `fds` in one sendmsg(2) on the socket's fd, SCM_RIGHTS attached to its first byte.
 * Called only while the socket's stream has nothing queued (so frames stay in order). Returns the bytes
 * of `frame` the kernel took (at least 1: the fds went with them); the connection writes the rest
 * through the stream. Throws (an Error whose message says why, e.g. EAGAIN, EPIPE) when nothing was sent.
 */
export type SendWithFds = (socket: net.Socket, frame: Buffer, fds: readonly number[]) => number;
