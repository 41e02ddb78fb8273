/** The serving process's side of the keeper: the fds it passed, by name, and the link to send it what to hold. */
import fs from 'node:fs';
import type { LogSink } from '../logging/logger.js';
import { cannotError } from '../common/errors.js';
import { prctl } from '../os/libc/capability-calls.js';
import { setCloexec } from '../os/libc/fds.js';
import { getPeerCredentials, isListeningSocket, peerHungUp, sendFds, socketType, SOCK_SEQPACKET, SOCK_STREAM } from '../os/libc/sockets.js';
import { encodeKeeperMessage, KEEPER_ENV, KEEPER_FIRST_FD, KEPT_NAMES, type KeeperMessageType } from './keeper-messages.js';

const MAX_KEPT_FDS = 70_000;
const PR_SET_PDEATHSIG = 1;
const SIGTERM = 15;

/** The fds a keeper passed, by name (KEEPER_ENV.fdNames, read and removed), or null; the start's are left to INHERIT_ENV. */
export function takeFromKeeper(env: NodeJS.ProcessEnv = process.env): Map<string, number[]> | null {
  const text = env[KEEPER_ENV.fdNames];
  delete env[KEEPER_ENV.fdNames];
  if (text === undefined || env[KEEPER_ENV.channel] === undefined) return null;
  const names = text.split(':');
  const fix = 'it is set by the keeper for the process it starts, do not set it';
  if (names.length > MAX_KEPT_FDS) throw cannotError(`read ${KEEPER_ENV.fdNames}`, `${names.length} names, at most ${MAX_KEPT_FDS}`, fix);
  const named = new Map<string, number[]>();
  names.forEach((name, i) => {
    if (!name.startsWith(KEPT_NAMES.prefix)) throw cannotError(`read ${KEEPER_ENV.fdNames}`, `'${name}' is not a kept fd's name`, fix);
    if (name !== KEPT_NAMES.start) named.set(name, [...(named.get(name) ?? []), KEEPER_FIRST_FD + i]);
  });
  return named;
}

function channelFd(env: NodeJS.ProcessEnv): number | null {
  const text = env[KEEPER_ENV.channel];
  const fd = text !== undefined && /^\d{1,7}$/.test(text) ? Number(text) : -1;
  try {
    return fd > 2 && socketType(fd) === SOCK_SEQPACKET ? fd : null;
  } catch {
    return null;
  }
}

/** The send of a message to this process's keeper (false: not sent; the first failure logged), or null without one (a bad channel logged). */
export function keeperLink(log: LogSink<'warn'>): ((type: KeeperMessageType, text?: string, fd?: number) => boolean) | null {
  const given = process.env[KEEPER_ENV.channel];
  if (given === undefined) return null;
  const channel = channelFd(process.env);
  if (channel === null) {
    log.warn({ fd: given }, `${KEEPER_ENV.channel} names no keeper's channel: serving without a keeper`);
    delete process.env[KEEPER_ENV.channel];
    return null;
  }
  // Node opens inherited fds close-on-exec: the channel must cross every restart in place.
  setCloexec(channel, false);
  let gone = false;
  return (type, text = '', fd) => {
    try {
      if (!gone) sendFds(channel, encodeKeeperMessage(type, text), fd === undefined ? [] : [fd]);
    } catch (e) {
      gone = true;
      log.warn(
        { err: (e as Error).message },
        'the keeper is gone: connections and checkpoints are no longer kept outside this process (a crash now loses them)',
      );
    }
    return !gone;
  };
}

/** SIGTERM (a clean stop) when the keeper dies (PR_SET_PDEATHSIG); false when it is gone already (the channel hung up). */
export function endWithKeeper(env: NodeJS.ProcessEnv = process.env): boolean {
  const fd = channelFd(env);
  if (fd === null) return true;
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  return !peerHungUp(fd);
}

/** The inode of `fd` when it is a connection (a stream socket, not listening; `peer`: with a peer process), else why not. */
export function connectionIno(fd: number, peer = false): { ino: bigint } | { why: string } {
  try {
    const st = fs.fstatSync(fd, { bigint: true }); // its error names fstat
    if (!st.isSocket()) return { why: 'it is not a socket' };
    if (socketType(fd) !== SOCK_STREAM) return { why: 'it is not a stream socket' };
    if (isListeningSocket(fd)) return { why: 'it is a listening socket, not a connection' };
    if (peer && getPeerCredentials(fd).pid <= 0) return { why: 'it has no peer process' };
    return { ino: st.ino };
  } catch (e) {
    return { why: (e as Error).message };
  }
}
