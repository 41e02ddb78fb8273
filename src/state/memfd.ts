/**
 * A state snapshot in a sealed memfd: written once, then sealed so that neither this process nor the
 * one it is handed to (a re-exec, or systemd's fd store) can change, grow or shrink it; read back from
 * an fd only when it is such a memfd.
 */
import fs from 'node:fs';
import { cannotError } from '../common/errors.js';
import { addSeals, F_SEAL_GROW, F_SEAL_SEAL, F_SEAL_SHRINK, F_SEAL_WRITE, getSeals, memfdCreate, closeFd } from '../os/libc.js';
import { decodeState, encodeState, MAX_STATE_BYTES } from './codec.js';
import type { StateSnapshot } from './snapshot.js';

/** The seals a state memfd carries: no write, no grow, no shrink, and no seal removed or added. */
export const STATE_SEALS = F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE;
export const STATE_MEMFD_NAME = 'vmsr-helper-state';

/** Writes the snapshot into a new memfd, seals it (STATE_SEALS) and returns its fd (close-on-exec). */
export function writeStateMemfd(s: StateSnapshot): number {
  const bytes = encodeState(s);
  const fd = memfdCreate(STATE_MEMFD_NAME);
  try {
    for (let off = 0; off < bytes.length; ) off += fs.writeSync(fd, bytes, off, bytes.length - off, off);
    addSeals(fd, STATE_SEALS);
    return fd;
  } catch (e) {
    closeFd(fd);
    throw e;
  }
}

/**
 * The snapshot in the memfd `fd` (which stays open: the caller closes it). Refused, with "cannot
 * restore state: why; fix", when the fd is not a memfd sealed with STATE_SEALS (someone could still
 * change it), is larger than any snapshot, or does not decode.
 */
export function readStateFd(fd: number): StateSnapshot {
  const fix = 'start without the saved state (registered VMs register again, discovery finds the rest)';
  let seals: number;
  try {
    seals = getSeals(fd);
  } catch (e) {
    throw cannotError('restore state', `fd ${fd} is not a memfd (${(e as Error).message})`, fix);
  }
  if ((seals & STATE_SEALS) !== STATE_SEALS) {
    throw cannotError('restore state', `the memfd has seals 0x${seals.toString(16)}, not all of 0x${STATE_SEALS.toString(16)}: it could still be changed`, fix);
  }
  const size = fs.fstatSync(fd).size;
  if (size > MAX_STATE_BYTES) throw cannotError('restore state', `the memfd holds ${size} bytes, a snapshot is at most ${MAX_STATE_BYTES}`, fix);
  const bytes = Buffer.alloc(size);
  for (let off = 0; off < size; ) {
    const n = fs.readSync(fd, bytes, off, size - off, off);
    if (n === 0) break;
    off += n;
  }
  const r = decodeState(bytes);
  if (!r.ok) throw new Error(r.error);
  return r.value;
}
