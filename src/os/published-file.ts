/**
 * A file published to untrusted readers (docs/stats-fd.md "The file"): a memfd mapped MAP_SHARED, then sealed so its size
 * never changes under a reader and only the mapping made before the seal writes (F_SEAL_FUTURE_WRITE).
 */
import fs from 'node:fs';
import { closeFd } from './libc/fds.js';
import {
  addSeals,
  F_SEAL_FUTURE_WRITE,
  F_SEAL_GROW,
  F_SEAL_SEAL,
  F_SEAL_SHRINK,
  mapShared,
  memfdCreate,
  type SharedMapping,
} from './libc/memfd-mmap.js';

const PUBLISHED_SEALS = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL;
const PUBLISHED_MODE = 0o444;

export class PublishedFile {
  private mapping: SharedMapping | null;
  private fdOpen: number | null;

  private constructor(
    fd: number,
    mapping: SharedMapping,
    readonly size: number,
  ) {
    this.fdOpen = fd;
    this.mapping = mapping;
  }

  /** A new file holding `bytes` (its size for good), mapped and sealed. Throws an errno error (EMFILE, ENOMEM). */
  static create(name: string, bytes: Buffer): PublishedFile {
    const fd = memfdCreate(name);
    let mapping: SharedMapping | null = null;
    try {
      fs.ftruncateSync(fd, bytes.length);
      mapping = mapShared(fd, bytes.length, true);
      new Uint8Array(mapping.memory).set(bytes);
      fs.fchmodSync(fd, PUBLISHED_MODE);
      addSeals(fd, PUBLISHED_SEALS);
      return new PublishedFile(fd, mapping, bytes.length);
    } catch (e) {
      mapping?.unmap();
      closeFd(fd);
      throw e;
    }
  }

  /** The mapped bytes; stores go to every reader. Throws once closed (the pages are gone). */
  get memory(): ArrayBuffer {
    if (this.mapping === null) throw new Error('the published file is closed');
    return this.mapping.memory;
  }

  get fd(): number {
    if (this.fdOpen === null) throw new Error('the published file is closed');
    return this.fdOpen;
  }

  /** A new O_RDONLY fd of the file, for a reader: a write or writable mapping through it fails whatever the seals. */
  openReadOnly(): number {
    return fs.openSync(`/proc/self/fd/${this.fd}`, fs.constants.O_RDONLY);
  }

  /** Unmaps and closes this process's fd; readers keep the file. A second call does nothing. */
  close(): void {
    this.mapping?.unmap();
    this.mapping = null;
    if (this.fdOpen !== null) closeFd(this.fdOpen);
    this.fdOpen = null;
  }
}
