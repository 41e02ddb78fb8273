/**
 * What the serving process tells its keeper, one SOCK_SEQPACKET message each: a type byte, then its text. The keeper trusts nothing
 * but the type and the fd attached (no text is a path): H hold this connection (fd attached; the keeper takes the inode from it),
 * D drop the connection of this inode (text: decimal), C the latest checkpoint (a sealed memfd attached), R serving, B the loop turns.
 */
import { takeEnvJson } from '../common/env-json.js';
import { cannotError } from '../common/errors.js';

export const KEEPER_MESSAGE = { hold: 'H', drop: 'D', checkpoint: 'C', ready: 'R', beat: 'B' } as const;
export type KeeperMessageType = (typeof KEEPER_MESSAGE)[keyof typeof KEEPER_MESSAGE];

/** Longest message: a type byte and an inode in decimal, with room to spare. */
export const MAX_KEEPER_MESSAGE_BYTES = 512;

export function encodeKeeperMessage(type: KeeperMessageType, text = ''): Buffer {
  const b = Buffer.from(type + text, 'utf8');
  if (b.length > MAX_KEEPER_MESSAGE_BYTES) throw new RangeError(`keeper message of ${b.length} bytes, at most ${MAX_KEEPER_MESSAGE_BYTES}`);
  return b;
}

/** The message in `bytes`, or null when it is none of ours. */
export function decodeKeeperMessage(bytes: Buffer): { type: KeeperMessageType; text: string } | null {
  const type = String.fromCharCode(bytes[0] ?? 0) as KeeperMessageType;
  if (bytes.length > MAX_KEEPER_MESSAGE_BYTES || !Object.values(KEEPER_MESSAGE).includes(type)) return null;
  return { type, text: bytes.subarray(1).toString('utf8') };
}

/** A serving process's environment from its keeper: the channel's fd, the names of the fds from KEEPER_FIRST_FD on, KeeperNote; `image`: the keeper's. */
export const KEEPER_ENV = {
  channel: 'VMSR_HELPER_KEEPER',
  fdNames: 'VMSR_HELPER_KEEPER_FDNAMES',
  note: 'VMSR_HELPER_KEEPER_NOTE',
  image: 'VMSR_HELPER_KEEPER_IMAGE',
} as const;
/** Set (to anything) in the environment of a start, as --no-keeper. */
export const NO_KEEPER_ENV = 'VMSR_HELPER_NO_KEEPER';

export const KEEPER_CHANNEL_FD = 3;
export const KEEPER_FIRST_FD = 4;

/** What the keeper tells a serving process it starts after a crash: the one that died, how (a signal or an exit code), when (wall-clock ms). */
export interface KeeperNote {
  pid: number;
  how: string;
  atMs: number;
  /** Crashes in a row so far, this one included. */
  crashes: number;
  /** Why the checkpoint was not passed on, when it was not. */
  checkpointDropped?: string;
  /** Ended by a signal from another process: not counted in `crashes`. */
  fromOutside?: boolean;
}

/** The keeper's account of the crash before this start (KEEPER_ENV.note, read and removed), or null. */
export function takeKeeperNote(env: NodeJS.ProcessEnv = process.env): KeeperNote | null {
  const valid = (v: Partial<KeeperNote>): boolean =>
    Number.isInteger(v.pid) &&
    typeof v.how === 'string' &&
    Number.isFinite(v.atMs) &&
    Number.isInteger(v.crashes) &&
    (v.checkpointDropped === undefined || typeof v.checkpointDropped === 'string') &&
    (v.fromOutside === undefined || typeof v.fromOutside === 'boolean');
  return takeEnvJson(KEEPER_ENV.note, valid, env) ?? null;
}

/** The names of the fds the next process takes. */
export const KEPT_NAMES = {
  prefix: 'vmsr-', // tells them from the .socket unit's
  connectionPrefix: 'vmsr-kept-', // and its inode (a restart in place: all under the bare prefix)
  checkpointPrefix: 'vmsr-ckpt-', // and a sequence number: the highest is the latest
  start: 'vmsr-start', // what the start opened (keeper only)
  restoring: 'vmsr-restoring', // a checkpoint is being restored (fd store only: a death with it set was a crash in the restore)
} as const;

/** What the root start gives the keeper's image in KEEPER_ENV.image; the socket file and pidfile are the only paths the keeper removes. */
export interface KeeperImage {
  command: string[];
  fds: number[];
  /** Added to each serving process's environment: INHERIT_ENV, the start's Inherited with its fds renumbered. */
  env: Record<string, string>;
  socketFile?: { ino: number; path: string };
  pidfile?: string;
  level: string;
}

/** KEEPER_ENV.image's value (read and removed), or null outside the keeper's image. */
export function takeKeeperImage(env: NodeJS.ProcessEnv = process.env): KeeperImage | null {
  const v = takeEnvJson<KeeperImage>(KEEPER_ENV.image, validImage, env);
  if (v === null) throw cannotError(`read ${KEEPER_ENV.image}`, 'it is malformed', 'it is set by the helper for itself, do not set it');
  return v ?? null;
}

const validImage = (v: Partial<KeeperImage>): boolean =>
  Array.isArray(v.command) &&
  v.command.length > 0 &&
  v.command.every((a) => typeof a === 'string') &&
  Array.isArray(v.fds) &&
  v.fds.every((fd) => Number.isInteger(fd) && fd > 2) &&
  typeof v.env === 'object' &&
  v.env !== null &&
  Object.values(v.env).every((x) => typeof x === 'string') &&
  typeof v.level === 'string';
