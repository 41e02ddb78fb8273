/**
 * How a legacy connection's replies leave: straight to the socket when Node's stream has nothing
 * queued, through the stream (copied, in order) otherwise.
 */
import os from 'node:os';
import type net from 'node:net';
import { errnoError } from '../../os/libc/errno.js';
import { sendNow } from '../../os/libc/sockets.js';
import { socketFd } from '../../os/peer.js';

const { EAGAIN } = os.constants.errno;

/**
 * Sends out[0, length) on a legacy connection: straight to the socket (a write request and its tick
 * cost more than the send) when the stream is empty; the rest queued through the stream, in order.
 */
export function sendReplies(socket: net.Socket, out: Buffer, length: number): void {
  let sent = 0;
  const fd = socket.writableLength === 0 ? socketFd(socket) : undefined;
  if (fd !== undefined) {
    const n = sendNow(fd, out, length);
    if (n === length) return;
    if (n < 0 && n !== -EAGAIN) {
      socket.destroy(errnoError('send a reply', -n));
      return;
    }
    sent = Math.max(n, 0);
  }
  socket.write(Buffer.from(out.subarray(sent, length)));
}
