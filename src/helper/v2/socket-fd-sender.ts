/** One non-blocking sendmsg(2) with the reply's fds in SCM_RIGHTS: a client that does not read never blocks the loop (EAGAIN throws). */
import { MSG_DONTWAIT, sendFds } from '../../os/libc/sockets.js';
import { socketFd } from '../../os/peer.js';
import type { SendWithFds } from './reply.js';

export const sendWithFdsOnSocket: SendWithFds = (socket, frame, fds) => {
  const fd = socketFd(socket);
  if (fd === undefined) throw new Error('the connection has no file descriptor (it closed)');
  return sendFds(fd, frame, fds, MSG_DONTWAIT);
};
