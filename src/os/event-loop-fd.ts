/** This process's event loop as the kernel sees it: the epoll fd libuv waits on, found by an fd it watches. */
import fs from 'node:fs';

/** Fds looked at, at most: the loop's is among the first a process opens (Node opens it before any script runs). */
const MAX_FDS_LOOKED_AT = 256;

/**
 * The epoll fd that watches `watched` (a connection the loop reads), from /proc/self/fdinfo (its "tfd:" lines), or null when
 * none of the first fds does. The loop's fd never changes in a process, so once is enough.
 */
export function eventLoopFd(watched: number): number | null {
  let names: string[];
  try {
    names = fs.readdirSync('/proc/self/fdinfo');
  } catch {
    return null;
  }
  const fds = names
    .map(Number)
    .filter((fd) => Number.isInteger(fd))
    .sort((a, b) => a - b)
    .slice(0, MAX_FDS_LOOKED_AT);
  const line = new RegExp(`^tfd:\\s+${watched}\\s`, 'm');
  for (const fd of fds) {
    let info: string;
    try {
      if (fs.readlinkSync(`/proc/self/fd/${fd}`) !== 'anon_inode:[eventpoll]') continue;
      info = fs.readFileSync(`/proc/self/fdinfo/${fd}`, 'latin1');
    } catch {
      continue;
    }
    if (line.test(info)) return fd;
  }
  return null;
}
