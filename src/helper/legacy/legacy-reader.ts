/**
 * A legacy connection read without Node's stream layer (`onread`: most of a round trip's user-space
 * time otherwise). Node offers `onread` only to sockets it creates: a new one on a duplicate of the fd.
 */
import net from 'node:net';
import { dupCloexec } from '../../os/libc/fds.js';
import { socketFd } from '../../os/peer.js';

/** Where every taken-over connection reads: one buffer, each read handled synchronously before the next. */
const READ_BUFFER = Buffer.allocUnsafe(64 * 1024);

/** A socket on the same connection handing each read to `onChunk` (valid during the call only); null when out of fds. */
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
