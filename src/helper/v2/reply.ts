/**
 * What a request is answered with: one frame, and maybe fds (SCM_RIGHTS). A reply's fds stay the
 * sender's: the connection calls release() exactly once, sent or not, so no fd leaks on either path.
 */
import type net from 'node:net';
import { encodeError } from '../../protocol/v2/codec.js';

export interface Reply {
  readonly frame: Buffer;
  /** Sent with the frame in one sendmsg (SCM_RIGHTS); absent or empty = a plain write. */
  readonly fds?: readonly number[];
  /** Called once the fds went out or never will; closes them. */
  readonly release?: () => void;
}

/** An ERROR reply to a request of type `type`. */
export function refusal(code: number, type: number, message: string): Reply {
  return { frame: encodeError(code, type, message) };
}

/**
 * Sends `frame` with `fds` in one sendmsg(2), only while nothing is queued on the stream; returns the
 * bytes the kernel took (at least 1; the rest goes through the stream); throws when nothing was sent.
 */
export type SendWithFds = (socket: net.Socket, frame: Buffer, fds: readonly number[]) => number;
