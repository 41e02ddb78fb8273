/**
 * One guest directory, written maybe as root into one another user may own (docs/guest.md "What the helper
 * refuses"). Nothing is followed: opened O_NOFOLLOW | O_DIRECTORY from --guest-dir's fd, each file made
 * O_CREAT | O_EXCL | O_NOFOLLOW in a directory fd the helper holds, renamed within it, checked by fstat, never reopened.
 */
import fs from 'node:fs';
import { cannot } from '../common/errors.js';
import { fail, ok, type Result } from '../common/result.js';
import {
  dropLease,
  exchangeAt,
  mkdirAt,
  O_CREAT,
  O_DIRECTORY,
  O_EXCL,
  O_NOFOLLOW,
  O_NONBLOCK,
  O_PATH,
  O_RDONLY,
  O_RDWR,
  O_WRONLY,
  openAt,
  readlinkAt,
  renameAt,
  symlinkAt,
  takeWriteLease,
  unlinkAt,
} from '../os/libc/dir-fd.js';
import { errnoName } from '../os/libc/errno.js';
import {
  closeFd,
  fchmodFd,
  fsetxattrFd,
  fstatRaw,
  pread,
  pwriteFd,
  STAT_ATIME_AT,
  STAT_SIZE,
  truncateFd,
  writeFd,
} from '../os/libc/fds.js';
import { mapShared, type SharedMapping } from '../os/libc/memfd-mmap.js';
import { isHelperEntry, TEMP_PREFIX } from './tree.js';
import type { DirWatch } from './dir-watch.js';

/** Entries a guest directory may hold before it is refused: checking each costs three calls. */
const MAX_GUEST_DIR_ENTRIES = 1000;
/** The file system's time granularity, at most: a change within it may hide another. */
const SETTLE_NS = 50_000_000n;
const FILE_MODE = 0o444;
const DIR_MODE = 0o755;
const ENOENT = 2;
const EAGAIN = 11;
const EEXIST = 17;
/** Bits of a directory's mode that let its group or anyone else add, remove or rename entries. */
const OTHERS_WRITE = 0o022n;
/** Where a planted entry with one of the helper's names is moved: no zone's name, no `.vmsr-` name. */
const PLANTED_PREFIX = '.planted-';
/** errnos of a write into a sound directory that may pass: a WriteFailure (tried again at the next sample), not a refusal. */
const PASSING = new Set(['ENOSPC', 'EDQUOT', 'EIO', 'ENOMEM', 'EMFILE', 'ENFILE', 'EINTR']);

export class WriteFailure extends Error {}

/** The error of a write of `what` that returned `r` (-errno, or fewer bytes than asked). */
function writeError(what: string, r: number, fix?: string): Error {
  const why = r >= 0 ? 'short write' : errnoName(-r);
  const message = cannot(what, why, fix);
  return r >= 0 || PASSING.has(why) ? new WriteFailure(message) : new Error(message);
}

/** Who may read a VM's directory besides its owner: the VM's uid and a group (docs/guest.md "Who reads it"). */
export interface GuestReaders {
  uid: number;
  gid: number | null;
}

/** system.posix_acl_access (v2): its owner may write, `readers` list and enter, nobody else; (tag, perm, id) in the kernel's order. */
function readersAcl(owner: number, readers: GuestReaders): Buffer {
  const NONE = 0xffffffff;
  const entries: [number, number, number][] = [[0x01, 7, NONE]];
  if (readers.uid !== owner && readers.uid !== 0) entries.push([0x02, 5, readers.uid]);
  entries.push([0x04, 0, NONE]);
  if (readers.gid !== null) entries.push([0x08, 5, readers.gid]);
  entries.push([0x10, 5, NONE], [0x20, 0, NONE]);
  const b = Buffer.alloc(4 + 8 * entries.length);
  b.writeUInt32LE(2, 0);
  entries.forEach(([tag, perm, id], i) => {
    b.writeUInt16LE(tag, 4 + 8 * i);
    b.writeUInt16LE(perm, 6 + 8 * i);
    b.writeUInt32LE(id, 8 + 8 * i);
  });
  return b;
}

/** What a directory is as lstat would say, from an fd opened O_PATH | O_NOFOLLOW. */
function kindOf(st: fs.BigIntStats): string {
  if (st.isSymbolicLink()) return 'a symlink';
  if (st.isFIFO()) return 'a FIFO';
  if (st.isCharacterDevice() || st.isBlockDevice()) return 'a device';
  if (st.isSocket()) return 'a socket';
  if (st.isDirectory()) return 'a directory';
  return st.nlink > 1n ? 'a hard link' : 'a file';
}

/** fstat of `name` in `dirFd` without following it, or null when it is not there. */
function lstatAt(dirFd: number, name: string): fs.BigIntStats | null {
  const fd = openAt(dirFd, name, O_PATH | O_NOFOLLOW);
  if (fd < 0) {
    if (fd === -ENOENT) return null;
    throw new Error(`${name}: ${errnoName(-fd)}`);
  }
  try {
    return fs.fstatSync(fd, { bigint: true });
  } finally {
    closeFd(fd);
  }
}

export const signature = (st: fs.BigIntStats) => `${st.ino}:${st.mtimeNs}:${st.ctimeNs}:${st.size}:${st.nlink}`;
/** Whether its last change is older than the file system's time granularity (a newer one may hide another). */
export const settled = (st: fs.BigIntStats) => st.mtimeNs < BigInt(Date.now()) * 1_000_000n - SETTLE_NS;
const statNow = Buffer.alloc(STAT_SIZE);

/** The directory's stat bytes without its access time (a read changes that alone): equal bytes, nothing changed. Null: fstat failed. */
function statBytes(fd: number): Buffer | null {
  if (fstatRaw(fd, statNow) < 0) return null;
  return statNow.fill(0, STAT_ATIME_AT, STAT_ATIME_AT + 16);
}
/** The helper's own uid: a directory it owns is as good as root's. */
export const EUID = process.geteuid?.() ?? 0;
/** Whether files must be chmod'ed after creation: the process's umask takes bits of 0444. */
const needChmod = (process.umask() & FILE_MODE) !== 0;
const textBuf = Buffer.alloc(64);

/** A file update() rewrites: `shown` at its name, `spare` (the last value) at its temporary name, each held open with its length. */
interface FilePair {
  dirFd: number;
  shown: { fd: number; len: number };
  spare: { fd: number; len: number } | null;
}

/** Whether update() swaps files (VMSR_GUEST_DIR_SWAP=0 turns it off, for the bench's comparison). */
const swapDefault = process.env.VMSR_GUEST_DIR_SWAP !== '0';

/** One VM's guest directory, opened and checked; the fds of the directories the helper made in it. */
export class SafeDir {
  /** The stat bytes of the last audit that saw the directory settled, or null: audit again. */
  private sig: Buffer | null = null;
  /** Directories made by the helper in it (zones, class, class/powercap), by relative name. */
  private readonly dirs = new Map<string, { fd: number; ino: bigint }>();
  /** Files of update(), by "rel/file": the one readers see and its spare, both held open. */
  private readonly pairs = new Map<string, FilePair>();
  /** False once leases or RENAME_EXCHANGE failed here (a file system without them): update() is write(). */
  private swapping = swapDefault;
  private watched: { watch: DirWatch; wd: number } | null = null;

  /** Entries planted with the helper's names go aside at the next audit (the directory was open to others). */
  private clearPlanted = false;
  /** Entries the audits moved aside, as `name -> new name` (the publisher says so). */
  readonly movedAside: string[] = [];

  private constructor(
    private readonly fd: number,
    readonly path: string,
    /** A directory a VM's user owns belongs to that user's VMs only. */
    readonly owner: number,
    /** A directory of root's or the helper's belongs to the VMs of its group (guest-dirs.ts). */
    readonly group: number,
  ) {}

  /** `name` under `rootFd` (its path `root`) when it is a directory owned by one of `owners`; else why not (null: absent). */
  static open(rootFd: number, root: string, name: string, owners: readonly number[]): Result<SafeDir, string | null> {
    const where = `${root}/${name}`;
    const fd = openAt(rootFd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    if (fd === -ENOENT) return fail(null);
    if (fd < 0) {
      const st = lstatAt(rootFd, name);
      return fail(st === null ? null : `${where} is ${kindOf(st)}, not a directory`);
    }
    const st = fs.fstatSync(fd, { bigint: true });
    const uid = Number(st.uid);
    if (owners.includes(uid)) return ok(new SafeDir(fd, where, uid, Number(st.gid)));
    closeFd(fd);
    return fail(`${where} is owned by uid ${uid}, not by root, the helper or the VM's user (uids ${[...new Set(owners)].join(', ')})`);
  }

  /** What `name` in `rootFd` is now (inode, times, size, links), not followed; '' when it is not there. */
  static signatureOf(rootFd: number, name: string): string {
    try {
      const st = lstatAt(rootFd, name);
      return st === null ? '' : signature(st);
    } catch {
      return '';
    }
  }

  /** Made readable by its owner and `readers` alone (the helper's directory: an ACL); why it cannot be, or null. */
  restrict(readers: GuestReaders): string | null {
    if (this.owner !== EUID) return null;
    const st = fs.fstatSync(this.fd, { bigint: true });
    // Open to others until now: whatever they planted with the helper's names goes aside at the audit.
    if ((st.mode & OTHERS_WRITE) !== 0n) this.clearPlanted = true;
    const r = fsetxattrFd(this.fd, 'system.posix_acl_access', readersAcl(this.owner, readers));
    if (r < 0)
      return cannot(`let only the VM's user and the observers read ${this.path}`, `its ACL: ${errnoName(-r)}`, 'put --guest-dir on tmpfs');
    return null;
  }

  /** Its changes told by `watch` (one inotify queue for every directory) instead of an fstat each sample, where it can. */
  watchWith(watch: DirWatch): boolean {
    if (this.watched !== null) return true;
    const wd = watch.add(this.fd);
    if (wd !== null) this.watched = { watch, wd };
    return wd !== null;
  }

  /** Whether the directory may have changed since the last audit(): its watch's events, else one fstat. */
  changed(): boolean {
    if (this.watched !== null) return this.sig === null || this.watched.watch.dirty.has(this.watched.wd);
    const now = statBytes(this.fd);
    return now === null || this.sig === null || !now.equals(this.sig);
  }

  /** Why the directory is refused (a symlink, hard link, FIFO, device or socket at its top; an entry at a helper's name the helper did not make), or null. */
  audit(): string | null {
    // Taken before the entries are read: a change made while they are read shows as a change next time.
    this.watched?.watch.dirty.delete(this.watched.wd);
    const before = statBytes(this.fd);
    const seen = before === null ? null : Buffer.from(before);
    const st = fs.fstatSync(this.fd, { bigint: true });
    // Given to another user since it was opened: it no longer belongs to the VM it was opened for.
    if (Number(st.uid) !== this.owner) return `${this.path} changed owner (uid ${this.owner} to ${st.uid})`;
    if (Number(st.gid) !== this.group) return `${this.path} changed group (gid ${this.group} to ${st.gid})`;
    const open = (st.mode & OTHERS_WRITE) !== 0n;
    const aside = open || this.clearPlanted;
    this.clearPlanted = false;
    const names = fs.readdirSync(`/proc/self/fd/${this.fd}`);
    if (names.length > MAX_GUEST_DIR_ENTRIES) return `${this.path} holds ${names.length} entries, more than ${MAX_GUEST_DIR_ENTRIES}`;
    for (const name of names) {
      const e = lstatAt(this.fd, name);
      if (e === null) continue;
      const kind = kindOf(e);
      if (kind !== 'a file' && kind !== 'a directory' && !(aside && isHelperEntry(name) && this.moveAside(name)))
        return `${this.path} holds ${kind}, ${JSON.stringify(name)}`;
      if (kind !== 'a file' && kind !== 'a directory') continue;
      if (isHelperEntry(name) && Number(e.uid) !== EUID) {
        // Planted by another user while others could write here: no longer at a name the guest reads as the helper's.
        if (aside && this.moveAside(name)) continue;
        return `${this.path}/${name} was not made by the helper (owned by uid ${e.uid}, the helper is uid ${EUID})`;
      }
      const made = this.dirs.get(name);
      // One of the helper's directories moved away and something else put there: made again.
      if (made !== undefined && made.ino !== e.ino) this.dropDir(name);
    }
    if (open)
      return `${this.path} is writable by others than its owner (mode ${(st.mode & 0o7777n).toString(8)}): entries planted with the helper's names are moved aside (${PLANTED_PREFIX}<name>)`;
    // Moved away with nothing in its place: let go too (made again when next written).
    const listed = new Set(names);
    for (const rel of [...this.dirs.keys()]) if (!rel.includes('/') && !listed.has(rel)) this.dropDir(rel);
    this.sig = settled(st) ? seen : null;
    return null;
  }

  /** A planted entry at one of the helper's names renamed to PLANTED_PREFIX + its name (+ its inode when that is taken): whether it moved. */
  private moveAside(name: string): boolean {
    let to = PLANTED_PREFIX + name;
    if (renameAt(this.fd, name, to) !== 0) {
      to = `${to}.${lstatAt(this.fd, name)?.ino ?? 0}`;
      if (renameAt(this.fd, name, to) !== 0) return false;
    }
    this.movedAside.push(`${name} -> ${to}`);
    return true;
  }

  /** The fd of the helper's directory `rel` ('a' or 'a/b', each made when missing, owned by the helper). */
  private dir(rel: string): number {
    const have = this.dirs.get(rel);
    if (have) return have.fd;
    const slash = rel.lastIndexOf('/');
    const parent = slash < 0 ? this.fd : this.dir(rel.slice(0, slash));
    const name = rel.slice(slash + 1);
    const made = mkdirAt(parent, name, DIR_MODE);
    if (made < 0 && made !== -EEXIST) throw writeError(`make ${this.path}/${rel}`, made, this.fix());
    const fd = openAt(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    if (fd < 0) throw new Error(`${this.path}/${rel} is not a directory the helper can open (${errnoName(-fd)})`);
    const st = fs.fstatSync(fd, { bigint: true });
    if (Number(st.uid) !== EUID) {
      closeFd(fd);
      throw new Error(`${this.path}/${rel} was not made by the helper (owned by uid ${st.uid})`);
    }
    if (made === 0) fchmodFd(fd, DIR_MODE);
    this.dirs.set(rel, { fd, ino: st.ino });
    return fd;
  }

  /** `text` as the file `file` of the helper's directory `rel` ('' the top): a new file renamed over the old one. */
  write(rel: string, file: string, text: string): void {
    const n = textBuf.write(text, 'latin1');
    const dirFd = rel === '' ? this.fd : this.dir(rel);
    closeFd(this.create(dirFd, rel, file, O_WRONLY, textBuf, n));
    this.rename(dirFd, file);
  }

  /**
   * write() at a third of the cost, same guarantee (old value or new, whole; one held open keeps it): the spare is rewritten
   * under a write lease (granted only while no one has it open, a 9p fid or mapping included; it blocks new opens), then
   * RENAME_EXCHANGE swaps the names. A spare someone holds is let go (its reader keeps it) and a new file made.
   */
  update(rel: string, file: string, text: string): void {
    if (!this.swapping) return this.write(rel, file, text);
    const n = textBuf.write(text, 'latin1');
    const key = `${rel}/${file}`;
    const pair = this.pairs.get(key);
    if (pair?.spare) {
      if (this.rewriteSpare(pair.spare, n)) return this.exchange(pair, file, pair.spare);
      // No leases here: its files were let go.
      if (!this.swapping) return this.write(rel, file, text);
      closeFd(pair.spare.fd);
      pair.spare = null;
    }
    const dirFd = rel === '' ? this.fd : this.dir(rel);
    const fd = this.create(dirFd, rel, file, O_WRONLY, textBuf, n);
    const made = { fd, len: n };
    if (pair === undefined) {
      this.rename(dirFd, file);
      this.pairs.set(key, { dirFd, shown: made, spare: null });
    } else this.exchange(pair, file, made);
  }

  /** The spare holding textBuf[0, n), rewritten under a lease; false when someone holds it (or leases fail here). */
  private rewriteSpare(spare: { fd: number; len: number }, n: number): boolean {
    const leased = takeWriteLease(spare.fd);
    if (leased < 0) {
      // EAGAIN: a reader has it open. Anything else: no leases here; files are made anew from now on.
      if (leased !== -EAGAIN) this.stopSwapping();
      return false;
    }
    try {
      const w = pwriteFd(spare.fd, textBuf, n, 0);
      if (w !== n) throw writeError(`write into ${this.path}`, w);
      // A value after the wrap is shorter: the old digits cut off before anyone can open it.
      const t = n < spare.len ? truncateFd(spare.fd, n) : 0;
      if (t < 0) throw writeError(`cut ${this.path}'s value short`, t);
      spare.len = n;
    } finally {
      dropLease(spare.fd);
    }
    return true;
  }

  /** `next` (at the temporary name, whole) exchanged with the shown file, which becomes the spare. */
  private exchange(pair: FilePair, file: string, next: { fd: number; len: number }): void {
    const r = exchangeAt(pair.dirFd, TEMP_PREFIX + file, file);
    if (r === 0) {
      pair.spare = pair.shown;
      pair.shown = next;
      return;
    }
    // A file system that cannot exchange: put the new file in place as write() does, and stop swapping.
    this.rename(pair.dirFd, file);
    if (next !== pair.spare) closeFd(next.fd);
    this.stopSwapping();
  }

  /** update() is write() from now on: the files it held are let go (they stay, with their values). */
  private stopSwapping(): void {
    this.swapping = false;
    for (const [k, pair] of [...this.pairs]) this.dropPair(k, pair);
  }

  /** A new top file holding `bytes`, mapped shared and writable, renamed into place; written here, so no store needs a page later. */
  mapped(file: string, bytes: Buffer): { mapping: SharedMapping; ino: bigint } {
    const fd = this.create(this.fd, '', file, O_RDWR, bytes, bytes.length);
    try {
      const mapping = mapShared(fd, bytes.length, true);
      const ino = fs.fstatSync(fd, { bigint: true }).ino;
      this.rename(this.fd, file);
      return { mapping, ino };
    } finally {
      closeFd(fd);
    }
  }

  /** The µJ count a regular file of the helper's holds (energy_uj made by an earlier run), or null. */
  readCount(rel: string, file: string): bigint | null {
    const fd = openAt(this.dir(rel), file, O_RDONLY | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return null;
    try {
      const st = fs.fstatSync(fd, { bigint: true });
      if (!st.isFile() || st.nlink !== 1n || Number(st.uid) !== EUID || st.size > 32n) return null;
      const n = pread(fd, textBuf, 32, 0);
      const m = n > 0 ? /^(\d{1,20})\n?$/.exec(textBuf.toString('latin1', 0, n)) : null;
      return m ? BigInt(m[1]!) : null;
    } finally {
      closeFd(fd);
    }
  }

  /** A symlink `name` holding `target` in the helper's directory `rel`, made (or made again) unless it holds that already. */
  link(rel: string, name: string, target: string): void {
    const dirFd = this.dir(rel);
    if (readlinkAt(dirFd, name) === target) return;
    unlinkAt(dirFd, name);
    const r = symlinkAt(target, dirFd, name);
    if (r < 0) throw writeError(`make the link ${this.path}/${rel}/${name}`, r, this.fix());
  }

  /** Whether the helper holds its directory `rel` now (one moved away is let go at the audit that sees it). */
  holds(rel: string): boolean {
    return this.dirs.has(rel);
  }

  /** Inode of the entry `name` at the top, or null when it is not there (the statistics file's check). */
  inodeOf(name: string): bigint | null {
    return lstatAt(this.fd, name)?.ino ?? null;
  }

  close(): void {
    if (this.watched !== null) this.watched.watch.remove(this.watched.wd);
    this.watched = null;
    for (const [k, pair] of [...this.pairs]) this.dropPair(k, pair);
    for (const rel of [...this.dirs.keys()]) this.dropDir(rel);
    closeFd(this.fd);
  }

  private dropPair(key: string, pair: FilePair): void {
    closeFd(pair.shown.fd);
    if (pair.spare) closeFd(pair.spare.fd);
    this.pairs.delete(key);
  }

  private dropDir(rel: string): void {
    for (const [k, pair] of [...this.pairs]) if (k.startsWith(`${rel}/`)) this.dropPair(k, pair);
    for (const [k, d] of [...this.dirs]) {
      if (k !== rel && !k.startsWith(`${rel}/`)) continue;
      closeFd(d.fd);
      this.dirs.delete(k);
    }
  }

  /** The fd of a new temporary file for `file` in `dirFd` (directory `rel`) holding bytes[0, n); one left by a crash goes first. */
  private create(dirFd: number, rel: string, file: string, access: number, bytes: Buffer, n: number): number {
    const tmp = TEMP_PREFIX + file;
    let fd = openAt(dirFd, tmp, access | O_CREAT | O_EXCL | O_NOFOLLOW, FILE_MODE);
    if (fd === -EEXIST) {
      unlinkAt(dirFd, tmp);
      fd = openAt(dirFd, tmp, access | O_CREAT | O_EXCL | O_NOFOLLOW, FILE_MODE);
    }
    if (fd < 0) throw writeError(`write into ${this.path}`, fd, this.fix());
    if (needChmod) fchmodFd(fd, FILE_MODE);
    const w = writeFd(fd, bytes, n);
    if (w === n) return fd;
    closeFd(fd);
    throw writeError(`write ${this.path}/${rel === '' ? '' : `${rel}/`}${file}`, w);
  }

  private rename(dirFd: number, file: string): void {
    const r = renameAt(dirFd, TEMP_PREFIX + file, file);
    if (r < 0) throw writeError(`put ${this.path}/${file} in place`, r, this.fix());
  }

  private fix(): string {
    return `the helper (uid ${EUID}) must be able to write ${this.path}: its owner is uid ${this.owner}`;
  }
}
