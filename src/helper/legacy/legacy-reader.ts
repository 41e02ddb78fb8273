/**
 * A legacy connection read without Node's stream layer. A net.Socket reads into a buffer it is
 * given and calls back with the count (its `onread` option) instead of allocating 64 KiB, pushing
 * through the Readable machinery, emitting 'data' and scheduling a tick per read: on a one-request
 * round trip that was most of our user-space time. Node offers `onread` only to sockets it creates,
 * so the accepted connection is taken over: a new socket on a duplicate of its fd (the same open
 * connection), after which the caller destroys the accepted one (its fd closes, the connection
 * stays open through the duplicate).
 */
import net from 'node:net';
import { dupCloexec } from '../../os/libc/fds.js';
import { socketFd } from '../../os/peer.js';

/**
 * Where every taken-over connection reads: one buffer, since each read is handled synchronously
 * before the next (the legacy framer copies what it keeps of an incomplete request).
 */
const READ_BUFFER = Buffer.allocUnsafe(64 * 1024);

/**
 * A socket on the same connection as `socket` that hands each read to `onChunk` (a view of the
 * shared buffer, valid during the call only); null when the fd cannot be duplicated (out of fds:
 * the caller goes on with `socket` as it is). The new socket starts reading at once.
 */
export function takeOverLegacy(socket: net.Socket, onChunk: (chunk: Buffer) => void): net.Socket | null {
  const fd = socketFd(socket);
  if (fd === undefined) return null;
  const dup = dupCloexec(fd);
  if (dup < 0) return null;
  const onread: net.OnReadOpts = {
    buffer: READ_BUFFER,
    callback: (n: number, buf: Uint8Array) => {
      onChunk(Buffer.from(buf.buffer, buf.byteOffset, n));
      return true; // false would pause the socket
    },
  };
  // `onread` is a documented option of the Socket constructor; @types/node lists it for connect() only.
  return new net.Socket({ fd: dup, readable: true, writable: true, onread } as net.SocketConstructorOpts);
}
