/**
 * A real AF_UNIX datagram socket (path or abstract) that collects what the helper sends to
 * NOTIFY_SOCKET. Node has no Unix datagram sockets, so this binds one through libc.
 */
import koffi from 'koffi';
import { sockaddrUn, AF_UNIX, SOCK_DGRAM, SOCK_CLOEXEC } from '../../../src/os/libc/sockets.js';

const libc = koffi.load('libc.so.6');
const socketFn = libc.func('int socket(int domain, int type, int protocol)');
const bindFn = libc.func('int bind(int fd, const void *addr, uint32_t addrlen)');
const recvFn = libc.func('long recv(int fd, void *buf, size_t len, int flags)');
const closeFn = libc.func('int close(int fd)');
const SOCK_NONBLOCK = 0o4000;

export class NotifyReceiver {
  private readonly fd: number;
  readonly messages: string[] = [];
  private readonly timer: NodeJS.Timeout;

  constructor(readonly name: string) {
    const { addr, len } = sockaddrUn(name);
    this.fd = socketFn(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0) as number;
    if (this.fd < 0) throw new Error('socket failed');
    if (bindFn(this.fd, addr, len) !== 0) {
      closeFn(this.fd);
      throw new Error(`bind(${name}) failed: errno ${koffi.errno()}`);
    }
    this.timer = setInterval(() => this.drain(), 10);
  }

  drain(): void {
    const buf = Buffer.alloc(4096);
    for (;;) {
      const n = Number(recvFn(this.fd, buf, buf.length, 0));
      if (n <= 0) return;
      this.messages.push(buf.subarray(0, n).toString('utf8'));
    }
  }

  close(): void {
    clearInterval(this.timer);
    closeFn(this.fd);
  }
}
