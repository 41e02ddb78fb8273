/** The continuity record in a memfd sealed so that neither this process nor the one it is handed to can change it. */
import fs from 'node:fs';
import { cannotError } from '../common/errors.js';
import { closeFd } from '../os/libc/fds.js';
import { addSeals, F_SEAL_GROW, F_SEAL_SEAL, F_SEAL_SHRINK, F_SEAL_WRITE, memfdCreate, unsealedWhy } from '../os/libc/memfd-mmap.js';
import { encodeState, FIX, MAX_STATE_BYTES } from './snapshot-codec.js';
import type { Handover, StateSnapshot } from './snapshot.js';

export const STATE_SEALS = F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE;

/** A new memfd named `name` holding `bytes`, sealed (STATE_SEALS); close-on-exec. */
export function writeSealedMemfd(name: string, bytes: Buffer): number {
  const fd = memfdCreate(name);
  try {
    for (let off = 0; off < bytes.length;) off += fs.writeSync(fd, bytes, off, bytes.length - off, off);
    addSeals(fd, STATE_SEALS);
    return fd;
  } catch (e) {
    closeFd(fd);
    throw e;
  }
}

/** The record of `s` and `handover` in a new sealed memfd. */
export function writeStateMemfd(s: StateSnapshot, handover?: Handover): number {
  return writeSealedMemfd('vmsr-helper-state', encodeState(s, handover));
}

/** The bytes of the state memfd `fd` (left open); refused when it is not sealed with STATE_SEALS or is larger than any record. */
export function readStateBytes(fd: number): Buffer {
  const refuse = (why: string) => cannotError('restore state', why, FIX);
  const unsealed = unsealedWhy(fd, STATE_SEALS);
  if (unsealed !== null) throw refuse(unsealed);
  const size = fs.fstatSync(fd).size;
  if (size > MAX_STATE_BYTES) throw refuse(`the memfd holds ${size} bytes, at most ${MAX_STATE_BYTES} expected`);
  const bytes = Buffer.alloc(size);
  for (let off = 0, n = -1; off < size && n !== 0; off += n) n = fs.readSync(fd, bytes, off, size - off, off);
  return bytes;
}
