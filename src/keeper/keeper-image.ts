/**
 * What the root start gives the keeper's image in KEEPER_ENV.image (never set by a serving process):
 * the fds it opened, the command each serving process runs, the socket file and pidfile (the only
 * paths the keeper removes), the log level.
 */
import { KEEPER_ENV } from './keeper-messages.js';
import { takeEnvJson } from '../common/env-json.js';

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
  const v = takeEnvJson<KeeperImage>(KEEPER_ENV.image, valid, env);
  if (v === null) throw new Error(`cannot read ${KEEPER_ENV.image}: it is malformed; it is set by the helper for itself, do not set it`);
  return v ?? null;
}

const valid = (v: Partial<KeeperImage>): boolean =>
  Array.isArray(v.command) &&
  v.command.length > 0 &&
  v.command.every((a) => typeof a === 'string') &&
  Array.isArray(v.fds) &&
  v.fds.every((fd) => Number.isInteger(fd) && fd > 2) &&
  typeof v.env === 'object' &&
  v.env !== null &&
  Object.values(v.env).every((x) => typeof x === 'string') &&
  typeof v.level === 'string';
