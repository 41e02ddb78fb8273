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
 * Sends out[0, length) on a legacy connection. With nothing queued in Node's stream, the bytes go
 * straight to the socket (send(2), MSG_DONTWAIT): no write request and no callback tick, which cost
 * more than the send itself. What the socket does not take now (its buffer full) is queued
 * through the stream, copied, after which every later reply queues behind it, so order is kept. A
 * peer that is gone (EPIPE, ECONNRESET) closes the connection, as a failed stream write would.
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
