/**
 * What a restart hands the next process, read and checked before anything of it is trusted
 * (docs/daemon.md "Restarts"): the named fds of the Inherited (from the re-exec in place, or from
 * systemd's fd store through LISTEN_FDNAMES). The state snapshot and the handover record each come in
 * a sealed memfd; each connection is a connected stream socket, paired with its record entry by inode.
 * Anything else, a second fd where one is expected, a state or record that does not decode, a socket
 * the record does not list: closed and logged, and the daemon goes on without it.
 */
import fs from 'node:fs';
import { closeFd } from '../../os/libc/fds.js';
import { getPeerCredentials, isListeningSocket, socketType, SOCK_STREAM } from '../../os/libc/sockets.js';
import { readStateBytes, readSealedMemfd } from '../../state/memfd.js';
import { decodeState } from '../../state/snapshot-codec.js';
import { decodeHandover, MAX_HANDOVER_BYTES, type HandoverRecord } from './handover-record.js';
import type { StateSnapshot } from '../../state/snapshot.js';
import type { HandedConnectionFd } from './frozen.js';
import { monotonicNs } from '../../sampling/tick-loop.js';

/** The fd names a restart hands over under (each starts with systemd.ts's STORED_FD_PREFIX). */
export const HANDOVER_NAMES = { state: 'vmsr-state', record: 'vmsr-handover', connections: 'vmsr-conn' } as const;

export interface HandedOver {
  /**
   * The live state's bytes, from a memfd sealed as it must be; decodeHandedState decodes them once the
   * daemon serves (hundreds of VMs take tens of ms to decode, and QEMU's requests wait for nothing of it).
   */
  state?: Buffer;
  /** The legacy request counters of the previous process. */
  legacy?: HandoverRecord['legacy'];
  /** Connections to serve, with what the previous process read of them. */
  connections: HandedConnectionFd[];
}

export interface HandoverLog {
  info(o: object, msg: string): void;
  warn(o: object, msg: string): void;
}

function closeAll(fds: readonly number[]): void {
  for (const fd of fds) closeFd(fd);
}

/** Why `fd` is not a connection to serve, or its inode when it is one (a connected stream socket with a peer). */
export function connectionProblem(fd: number): { ino: bigint } | { why: string } {
  let st: fs.BigIntStats;
  try {
    st = fs.fstatSync(fd, { bigint: true });
  } catch (e) {
    return { why: `fstat failed (${(e as Error).message})` };
  }
  if (!st.isSocket()) return { why: 'it is not a socket' };
  try {
    if (socketType(fd) !== SOCK_STREAM) return { why: 'it is not a stream socket' };
    if (isListeningSocket(fd)) return { why: 'it is a listening socket, not a connection' };
    if (getPeerCredentials(fd).pid <= 0) return { why: 'it has no peer process' };
  } catch (e) {
    return { why: (e as Error).message };
  }
  return { ino: st.ino };
}

/**
 * The handed-over state's snapshot, decoded and checked by the codec (planRestore checks it against
 * the host later); undefined, and logged, when it does not decode.
 */
export function decodeHandedState(bytes: Buffer, log: HandoverLog): StateSnapshot | undefined {
  let why: string;
  try {
    const r = decodeState(bytes);
    if (r.ok) return r.value;
    why = r.error;
  } catch (e) {
    why = (e as Error).message;
  }
  log.warn({ err: why }, 'saved state not restored: starting fresh');
  return undefined;
}

/**
 * Takes the handed-over parts out of `named` (the Inherited's named fds), checking each; every fd not
 * used is closed. Never throws: what cannot be used is logged and left out.
 */
export function takeHandedOver(
  named: ReadonlyMap<string, readonly number[]> | undefined,
  log: HandoverLog,
  nowNs: bigint = monotonicNs(),
): HandedOver {
  const out: HandedOver = { connections: [] };
  if (named === undefined || named.size === 0) return out;
  const known = new Set<string>(Object.values(HANDOVER_NAMES));
  for (const [name, fds] of named) {
    if (known.has(name)) continue;
    log.warn({ name, fds: fds.length }, `unexpected fds handed over as '${name}': closed`);
    closeAll(fds);
  }
  const one = (name: string): number | null => {
    const fds = named.get(name) ?? [];
    if (fds.length === 1) return fds[0]!;
    if (fds.length > 1) {
      log.warn({ name, fds: fds.length }, `cannot use '${name}': ${fds.length} fds handed over, one expected; closed`);
      closeAll(fds);
    }
    return null;
  };

  const stateFd = one(HANDOVER_NAMES.state);
  if (stateFd !== null) {
    try {
      out.state = readStateBytes(stateFd);
    } catch (e) {
      log.warn({ err: (e as Error).message }, 'saved state not restored: starting fresh');
    } finally {
      closeFd(stateFd);
    }
  }

  let record: HandoverRecord | null = null;
  const recordFd = one(HANDOVER_NAMES.record);
  if (recordFd !== null) {
    try {
      const r = decodeHandover(
        readSealedMemfd(recordFd, MAX_HANDOVER_BYTES, 'use the handover record', 'the handed-over connections are closed'),
        nowNs,
      );
      if (r.ok) record = r.value;
      else log.warn({ err: r.error }, 'handover record refused: the handed-over connections are closed');
    } catch (e) {
      log.warn({ err: (e as Error).message }, 'handover record refused: the handed-over connections are closed');
    } finally {
      closeFd(recordFd);
    }
  }
  if (record !== null) out.legacy = record.legacy;

  const conns = named.get(HANDOVER_NAMES.connections) ?? [];
  if (record === null) {
    if (conns.length > 0) log.warn({ connections: conns.length }, 'connections handed over without a usable handover record: closed');
    closeAll(conns);
    return out;
  }
  const byIno = new Map(record.connections.map((c) => [c.ino, c]));
  let refused = 0;
  for (const fd of conns) {
    const c = connectionProblem(fd);
    const entry = 'ino' in c ? byIno.get(c.ino) : undefined;
    if (entry === undefined) {
      refused++;
      log.warn(
        { fd, why: 'why' in c ? c.why : 'the handover record does not list it' },
        'handed-over fd is not a connection to serve: closed',
      );
      closeFd(fd);
      continue;
    }
    byIno.delete(entry.ino);
    out.connections.push({ fd, kind: entry.kind, pending: entry.pending });
  }
  log.info(
    { connections: out.connections.length, refused, gone: byIno.size, state: out.state !== undefined },
    `handed over: ${out.connections.length} connections${byIno.size > 0 ? ` (${byIno.size} closed by their client meanwhile)` : ''}`,
  );
  return out;
}
