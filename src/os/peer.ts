/** Who is on the other end of a connection, and whether a thread id belongs to them. */
import fs from 'node:fs';
import path from 'node:path';
import type net from 'node:net';
import os from 'node:os';
import { closeFd } from './libc/fds.js';
import { pidfdAlive } from './libc/processes.js';
import { getPeerCredentials, peerPidfd, socketFd, type PeerCredentials } from './libc/sockets.js';
import { MAX_TID } from '../model/vcpus.js';
import { parseProcStatus } from './privileges/proc-status.js';
import { readProcFileOr } from './proc-file.js';

/** SO_PEERCRED of an accepted connection; throws when it cannot be had (the caller closes). */
export function peerOf(socket: net.Socket): PeerCredentials {
  const fd = socketFd(socket);
  if (fd === undefined) throw new Error('connection has no file descriptor');
  const cred = getPeerCredentials(fd);
  if (cred.pid <= 0) throw new Error(`peer has no pid (SO_PEERCRED pid ${cred.pid})`);
  return cred;
}

/**
 * The start time of the very process that connected on `socket`: read by pid, kept only when its pidfd (SO_PEERPIDFD) says it
 * still runs (by accept it may have exited, its pid reused: null). Before Linux 6.5, that of whatever holds the pid.
 */
export function connectingProcessStart(socket: net.Socket, pid: number, starttimeOf: (pid: number) => number | null): number | null {
  const fd = socketFd(socket);
  if (fd === undefined) return null;
  const pidfd = peerPidfd(fd);
  if (pidfd === -os.constants.errno.ESRCH) return null;
  const start = starttimeOf(pid);
  if (pidfd < 0) return start;
  try {
    // Alive after the read: the pid named it during the read, so the start time is its own.
    return pidfdAlive(pidfd) ? start : null;
  } finally {
    closeFd(pidfd);
  }
}

/** The live threads of one process, as /proc/<pid>/task/<tid> shows them. */
export class PeerTasks {
  private readonly prefix: string;

  constructor(
    procRoot: string,
    private readonly pid: number,
  ) {
    this.prefix = `${path.join(procRoot, String(pid), 'task')}/`;
  }

  /** tid 0 and values beyond pid_t are refused without touching /proc. */
  has(tid: number): boolean {
    if (!Number.isInteger(tid) || tid <= 0 || tid > MAX_TID || !(this.pid > 0)) return false;
    return fs.existsSync(this.prefix + tid);
  }
}

export function tidBelongsTo(procRoot: string, pid: number, tid: number): boolean {
  return new PeerTasks(procRoot, pid).has(tid);
}

/**
 * Whether the peer is in group `gid`: primary, or supplementary per /proc/<pid>/status (which covers systemd's
 * SupplementaryGroups=, /etc/group does not), believed only while its real and effective uid are the peer's (pid reuse).
 */
export function peerInGroup(procRoot: string, peer: PeerCredentials, gid: number): boolean {
  if (peer.gid === gid) return true;
  const text = readProcFileOr(path.join(procRoot, String(peer.pid), 'status'), 'utf8');
  if (text === null) return false;
  const st = parseProcStatus(text);
  if (st.uid[0] !== peer.uid || st.uid[1] !== peer.uid) return false;
  return st.gid[1] === gid || st.groups.includes(gid);
}
