/**
 * What a start finds kept outside the last serving process (docs/daemon.md "Crashes"): the connections
 * the keeper or systemd's fd store held from their accept on, and the latest checkpoint. After a
 * planned restart the handover record says what each connection is (the kept ones join the handed
 * ones); after a crash there is none: each kept connection is served from its next byte, and the
 * checkpoint is the state, unless the last process died restoring it.
 */
import { closeFd } from '../../os/libc/fds.js';
import { readStateBytes } from '../../state/memfd.js';
import type { StateSnapshot } from '../../state/snapshot.js';
import { KEPT_NAMES, type KeeperNote } from '../../keeper/keeper-messages.js';
import type { HandedConnectionFd } from '../handover/frozen.js';
import { connectionProblem, HANDOVER_NAMES, type HandoverLog } from '../handover/handed-over.js';

/** Test hook: a restore of a checkpoint holding a VM of this pid crashes (SIGABRT), as a bug in the restore would. */
export const CRASH_ON_VM_PID_ENV = 'VMSR_HELPER_TEST_CRASH_ON_VM_PID';

export interface Kept {
  /** The named fds left for takeHandedOver (kept connections joined to HANDOVER_NAMES.connections when a record came). */
  named: Map<string, readonly number[]>;
  /** A crash's leftovers (no handover record): the kept connections, checked, and the checkpoint's bytes. */
  crash: { connections: HandedConnectionFd[]; state?: Buffer; checkpointDropped?: string } | null;
  /** The checkpoint names found (the fd store removes them once this process wrote its own). */
  checkpointNames: string[];
  /** The fd store held the mark that a checkpoint was being restored. */
  restoringMark: boolean;
}

const seqOf = (name: string) => BigInt(name.slice(KEPT_NAMES.checkpointPrefix.length).replace(/\D/g, '') || '0');

/** Takes the kept parts out of `named`; every fd not used is closed. Never throws. */
export function takeKept(named: ReadonlyMap<string, readonly number[]> | undefined, note: KeeperNote | null, log: HandoverLog): Kept {
  const rest = new Map<string, readonly number[]>();
  const conns: number[] = [];
  const checkpoints: [string, number][] = [];
  let restoringMark = false;
  for (const [name, fds] of named ?? []) {
    if (name.startsWith(KEPT_NAMES.connectionPrefix)) conns.push(...fds);
    else if (name.startsWith(KEPT_NAMES.checkpointPrefix)) for (const fd of fds) checkpoints.push([name, fd]);
    else if (name === KEPT_NAMES.restoring) {
      restoringMark = true;
      fds.forEach(closeFd);
    } else rest.set(name, fds);
  }
  const checkpointNames = [...new Set(checkpoints.map(([n]) => n))];
  checkpoints.sort((a, b) => (seqOf(b[0]) > seqOf(a[0]) ? 1 : -1));
  if (rest.has(HANDOVER_NAMES.record)) {
    // A planned restart: its state wins over a checkpoint, its record says what each connection is.
    for (const [, fd] of checkpoints) closeFd(fd);
    rest.set(HANDOVER_NAMES.connections, [...(rest.get(HANDOVER_NAMES.connections) ?? []), ...conns]);
    return { named: rest, crash: null, checkpointNames, restoringMark };
  }
  if (conns.length === 0 && checkpoints.length === 0 && note === null) return { named: rest, crash: null, checkpointNames, restoringMark };
  const connections: HandedConnectionFd[] = [];
  for (const fd of conns) {
    const c = connectionProblem(fd);
    if ('why' in c) {
      log.warn({ fd, why: c.why }, 'kept fd is not a connection to serve: closed');
      closeFd(fd);
    } else connections.push({ fd, kind: 'undecided', pending: Buffer.alloc(0) });
  }
  const crash: NonNullable<Kept['crash']> = { connections };
  const dropped = note?.checkpointDropped ?? (restoringMark ? 'the process before died while restoring it' : undefined);
  if (dropped !== undefined) crash.checkpointDropped = dropped;
  for (const [i, [, fd]] of checkpoints.entries()) {
    if (i === 0 && dropped === undefined) {
      try {
        crash.state = readStateBytes(fd);
      } catch (e) {
        crash.checkpointDropped = (e as Error).message;
      }
    }
    closeFd(fd);
  }
  return { named: rest, crash, checkpointNames, restoringMark };
}

export interface CrashLog extends HandoverLog {
  error(o: object, msg: string): void;
}

/**
 * The one line a start after a crash logs: what was kept, the checkpoint restored (and how old it was
 * when the process died) or why none, and what that means for the energy. `restored` is the decoded
 * checkpoint, when it decoded.
 */
function diedHow(note: KeeperNote): string {
  // A SIGHUP that came while Node started is a restart asked for (the keeper does not count it).
  if (note.how === 'SIGHUP')
    return `the serving process (pid ${note.pid}) was ended by a SIGHUP that came while it started (a restart asked for, not counted as a crash)`;
  if (note.fromOutside)
    return `the serving process (pid ${note.pid}) was ended by ${note.how} from another process (not counted as a crash)`;
  return `the serving process (pid ${note.pid}) died (${note.how}, crash ${note.crashes} in a row)`;
}

export function reportCrash(
  crash: NonNullable<Kept['crash']>,
  note: KeeperNote | null,
  restored: StateSnapshot | undefined,
  log: CrashLog,
): void {
  const crashedAtNs = BigInt(Math.round(note?.atMs ?? Date.now())) * 1_000_000n;
  const lastNs = restored?.lastSample?.realtimeNs;
  const ageMs = lastNs !== undefined ? Number((crashedAtNs - lastNs) / 1_000_000n) : undefined;
  const by = note === null ? 'the last serving process ended without handing over (a crash)' : diedHow(note);
  const what =
    restored !== undefined
      ? `state restored from the checkpoint of its last sample${ageMs !== undefined ? ` (${ageMs} ms before it died)` : ''}: the energy since is split over the gap at the first sample, as after a restart (lost only if the gap passes 60 s: then the totals go on from the checkpoint and the gap is not attributed)`
      : `no checkpoint restored (${crash.checkpointDropped ?? (crash.state ? 'it did not decode' : 'none was kept')}): v2 totals start from 0`;
  const fields = {
    connections: crash.connections.length,
    checkpoint: restored !== undefined,
    ...(ageMs !== undefined ? { checkpointAgeMs: ageMs } : {}),
    ...(note ? { crashed: note } : {}),
  };
  log.warn(fields, `recovered from a crash: ${by}; ${crash.connections.length} QEMU connections kept; ${what}`);
  const poison = Number(process.env[CRASH_ON_VM_PID_ENV] ?? 0);
  if (poison > 0 && restored?.vms.some((v) => v.pid === poison)) {
    log.error({ pid: poison }, `${CRASH_ON_VM_PID_ENV}: crashing inside the restore, as asked`);
    process.abort();
  }
}
