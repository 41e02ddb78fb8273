/**
 * The SendWithFds the daemon wires into its connections (reply.ts): one sendmsg(2) on the socket's own
 * fd with the reply's fds in SCM_RIGHTS, non-blocking, so a client that does not read never blocks the
 * event loop (EAGAIN throws, and the connection drops that client as it drops any that does not read).
 */
import { MSG_DONTWAIT, sendFds } from '../../os/libc/sockets.js';
import { socketFd } from '../../os/peer.js';
import type { SendWithFds } from './reply.js';

export const sendWithFdsOnSocket: SendWithFds = (socket, frame, fds) => {
  const fd = socketFd(socket);
  if (fd === undefined) throw new Error('the connection has no file descriptor (it closed)');
  return sendFds(fd, frame, fds, MSG_DONTWAIT);
};
