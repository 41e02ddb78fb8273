/** Which guest directories changed, from one inotify queue read per sample instead of an fstat each (docs/guest.md); watched by fd. */
import {
  IN_ATTRIB,
  IN_CREATE,
  IN_DELETE,
  IN_DELETE_SELF,
  IN_MOVE_SELF,
  IN_MOVED_FROM,
  IN_MOVED_TO,
  IN_Q_OVERFLOW,
  inotifyInit,
  inotifyUnwatch,
  inotifyWatchFd,
} from '../os/libc/dir-fd.js';
import { closeFd, readFd } from '../os/libc/fds.js';

/** What a directory is watched for: anything that changes its entries, their kinds or owners, or its own. */
const WATCH_MASK = IN_ATTRIB | IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF;
/** struct inotify_event's fixed part: wd, mask, cookie, len (then len bytes of name). */
const EVENT_HEADER = 16;
/** Reads of the queue per sample before every directory counts as changed (the work stays bounded). */
const MAX_READS = 16;
const EAGAIN = 11;

export class DirWatch {
  private readonly buf = Buffer.alloc(64 * 1024);
  /** Watch descriptors of the directories watched, with how many holders each (one inode, one wd). */
  private readonly holders = new Map<number, number>();
  /** Watch descriptors with events since their directory was last checked (its checker deletes its wd as it starts). */
  readonly dirty = new Set<number>();

  private constructor(private fd: number) {}

  /** A new instance, or null where inotify cannot be had (then every directory is fstat'ed). */
  static open(): DirWatch | null {
    const fd = inotifyInit();
    return fd < 0 ? null : new DirWatch(fd);
  }

  /** Watches the directory open as `dirFd`: its watch descriptor, or null when refused (fstat it instead). */
  add(dirFd: number): number | null {
    if (this.fd < 0) return null;
    const wd = inotifyWatchFd(this.fd, dirFd, WATCH_MASK);
    if (wd < 0) return null;
    this.holders.set(wd, (this.holders.get(wd) ?? 0) + 1);
    return wd;
  }

  /** A holder of `wd` lets go; the watch goes with its last holder. */
  remove(wd: number): void {
    const n = (this.holders.get(wd) ?? 0) - 1;
    if (n > 0) return void this.holders.set(wd, n);
    this.holders.delete(wd);
    this.dirty.delete(wd);
    if (this.fd >= 0) inotifyUnwatch(this.fd, wd);
  }

  /** The queue read (once per sample): the directories with events are marked changed. */
  drain(): void {
    for (let i = 0; i < MAX_READS; i++) {
      const n = readFd(this.fd, this.buf, this.buf.length);
      if (n === -EAGAIN || n === 0) return;
      if (n < 0) break;
      if (this.mark(n)) break;
    }
    // Overflowed, too many events, or the read failed: every directory is checked.
    for (const wd of this.holders.keys()) this.dirty.add(wd);
  }

  /** Marks the directories of the `n` bytes of events read; true when the queue overflowed. */
  private mark(n: number): boolean {
    for (let at = 0; at + EVENT_HEADER <= n; at += EVENT_HEADER + this.buf.readUInt32LE(at + 12)) {
      if ((this.buf.readUInt32LE(at + 4) & IN_Q_OVERFLOW) !== 0) return true;
      const wd = this.buf.readInt32LE(at);
      if (this.holders.has(wd)) this.dirty.add(wd);
    }
    return false;
  }

  close(): void {
    if (this.fd >= 0) closeFd(this.fd);
    this.fd = -1;
    this.holders.clear();
    this.dirty.clear();
  }
}
