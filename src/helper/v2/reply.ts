/** A request's answer: one frame, maybe fds (SCM_RIGHTS), which stay the sender's: release() is called once, sent or not (no leak). */
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

/** `frame` and `fds` in one sendmsg(2), nothing queued before it; returns the bytes taken (at least 1, the rest by the stream), or throws. */
export type SendWithFds = (socket: net.Socket, frame: Buffer, fds: readonly number[]) => number;
