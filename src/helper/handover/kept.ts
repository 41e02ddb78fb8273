/** What a start finds kept from the process before it, each part checked (docs/daemon.md "Restarts", "Crashes"), and the crash hooks. */
import { closeFd } from '../../os/libc/fds.js';
import { connectionIno } from '../../keeper/link.js';
import { readStateBytes } from '../../state/memfd.js';
import { decodeHandover, decodeState } from '../../state/snapshot-codec.js';
import type { Handover, StateSnapshot } from '../../state/snapshot.js';
import { KEPT_NAMES, takeKeeperNote, type KeeperNote } from '../../keeper/keeper-messages.js';
import type { HandedConnectionFd } from './frozen.js';
import { monotonicNs } from '../../sampling/tick-loop.js';
import type { LogSink } from '../../logging/logger.js';
import { outsideKeep, type OutsideKeep, type StoreNotifier } from './outside-keep.js';

/** Test hook: a restore of a checkpoint holding a VM of this pid crashes (SIGABRT), as a bug in the restore would. */
export const CRASH_ON_VM_PID_ENV = 'VMSR_HELPER_TEST_CRASH_ON_VM_PID';

export interface Kept {
  /** The record's bytes, decoded once the daemon serves. */
  state?: Buffer;
  legacy?: Handover['legacy'];
  connections: HandedConnectionFd[];
  /** A crash (no hand-over): why the checkpoint was not used, when it was not. */
  crash: { checkpointDropped?: string } | null;
  /** The checkpoint names found (the fd store removes them once this process wrote its own). */
  checkpointNames: string[];
  /** The fd store held the mark that a checkpoint was being restored. */
  restoringMark: boolean;
}

/** The names of an image from before the one record (docs/daemon.md "Restarts"): its state is the oldest checkpoint; its hand-over is closed. */
const PRE_RECORD_NAMES = { state: 'vmsr-state', connections: 'vmsr-conn' } as const;

const seqOf = (name: string) => BigInt(name.slice(KEPT_NAMES.checkpointPrefix.length).replace(/\D/g, '') || '0');

/** The kept fds by what they are; a name not of ours is closed and logged. */
function sort(named: ReadonlyMap<string, readonly number[]> | undefined, log: LogSink<'warn'>) {
  const conns: number[] = [];
  const checkpoints: [string, number][] = [];
  let restoringMark = false;
  for (const [name, fds] of named ?? []) {
    if (name.startsWith(KEPT_NAMES.connectionPrefix) || name === PRE_RECORD_NAMES.connections) conns.push(...fds);
    else if (name.startsWith(KEPT_NAMES.checkpointPrefix) || name === PRE_RECORD_NAMES.state)
      for (const fd of fds) checkpoints.push([name, fd]);
    else {
      if (name === KEPT_NAMES.restoring) restoringMark = true;
      else log.warn({ name, fds: fds.length }, `unexpected fds handed over as '${name}': closed`);
      fds.forEach(closeFd);
    }
  }
  checkpoints.sort((a, b) => (seqOf(b[0]) > seqOf(a[0]) ? 1 : -1));
  return { conns, checkpoints, restoringMark, checkpointNames: [...new Set(checkpoints.map(([n]) => n))] };
}

/** Takes the kept parts out of `named`, checking each; every fd not used is closed. Never throws. */
export function takeKept(
  named: ReadonlyMap<string, readonly number[]> | undefined,
  note: KeeperNote | null,
  log: LogSink<'info' | 'warn'>,
  nowNs: bigint = monotonicNs(),
): Kept {
  const { conns, checkpoints, restoringMark, checkpointNames } = sort(named, log);
  let why = note?.checkpointDropped ?? (restoringMark ? 'the process before died while restoring it' : undefined);
  let state: Buffer | undefined;
  // The latest record only (its hand-over, when it has one); every record fd is closed.
  for (const [i, [, fd]] of checkpoints.entries()) {
    try {
      if (i === 0 && why === undefined) state = readStateBytes(fd);
    } catch (e) {
      why = (e as Error).message;
    }
    closeFd(fd);
  }
  const r = state === undefined ? null : decodeHandover(state, nowNs);
  if (r?.ok === false)
    log.warn({ err: r.error }, 'handover record refused: the connections are served from their next byte, as after a crash');
  const h = r?.ok ? r.value : null;
  const out: Kept = { state, legacy: h?.legacy, connections: [], crash: null, checkpointNames, restoringMark };
  if (h === null && (conns.length > 0 || checkpoints.length > 0 || note !== null))
    out.crash = why !== undefined ? { checkpointDropped: why } : {};
  const listed = new Map(h?.connections.map((c) => [c.ino, c]));
  for (const fd of conns) {
    const c = connectionIno(fd, true);
    const entry = 'ino' in c ? listed.get(c.ino) : undefined;
    if ('ino' in c && h === null) out.connections.push({ fd, kind: 'undecided', pending: Buffer.alloc(0) });
    else if (entry !== undefined) {
      listed.delete(entry.ino);
      out.connections.push({ fd, kind: entry.kind, pending: entry.pending });
    } else {
      log.warn({ fd, why: 'why' in c ? c.why : 'the handover record does not list it' }, 'kept fd is not a connection to serve: closed');
      closeFd(fd);
    }
  }
  if (h !== null)
    log.info(
      { connections: out.connections.length, gone: listed.size, state: out.state !== undefined },
      `handed over: ${out.connections.length} connections${listed.size > 0 ? ` (${listed.size} closed by their client meanwhile)` : ''}`,
    );
  return out;
}

type CrashLog = LogSink<'info' | 'warn' | 'error'>;

function diedHow(note: KeeperNote): string {
  const who = `the serving process (pid ${note.pid})`;
  // A SIGHUP that came while Node started is a restart asked for (the keeper does not count it).
  if (note.how === 'SIGHUP') return `${who} was ended by a SIGHUP that came while it started (a restart asked for, not counted as a crash)`;
  if (note.fromOutside) return `${who} was ended by ${note.how} from another process (not counted as a crash)`;
  return `${who} died (${note.how}, crash ${note.crashes} in a row)`;
}

/** The one line a start after a crash logs: what was kept, the checkpoint restored (and its age) or why none. */
function reportCrash(kept: Kept, note: KeeperNote | null, restored: StateSnapshot | undefined, log: CrashLog): void {
  const crash = kept.crash;
  if (crash === null) return;
  const crashedAtNs = BigInt(Math.round(note?.atMs ?? Date.now())) * 1_000_000n;
  const lastNs = restored?.lastSample?.realtimeNs;
  const ageMs = lastNs !== undefined ? Number((crashedAtNs - lastNs) / 1_000_000n) : undefined;
  const by = note === null ? 'the last serving process ended without handing over (a crash)' : diedHow(note);
  const what =
    restored !== undefined
      ? `state restored from the checkpoint of its last sample${ageMs !== undefined ? ` (${ageMs} ms before it died)` : ''}: the energy since is split over the gap at the first sample, as after a restart (lost only if the gap passes 60 s: then the totals go on from the checkpoint and the gap is not attributed)`
      : `no checkpoint restored (${crash.checkpointDropped ?? (kept.state ? 'it did not decode' : 'none was kept')}): v2 totals start from 0`;
  const n = kept.connections.length;
  const fields = {
    connections: n,
    checkpoint: restored !== undefined,
    ...(ageMs !== undefined ? { checkpointAgeMs: ageMs } : {}),
    ...(note ? { crashed: note } : {}),
  };
  log.warn(fields, `recovered from a crash: ${by}; ${n} QEMU connections kept; ${what}`);
  const poison = Number(process.env[CRASH_ON_VM_PID_ENV] ?? 0);
  if (poison > 0 && restored?.vms.some((v) => v.pid === poison)) {
    log.error({ pid: poison }, `${CRASH_ON_VM_PID_ENV}: crashing inside the restore, as asked`);
    process.abort();
  }
}

/** The v2 service: given the live state after every sample, before any client is told of it. */
interface Checkpointed {
  checkpointTo(to: ((state: StateSnapshot | Error) => void) | null): void;
}

/** Takes what the process before kept out of the inherited named fds, and keeps this one's outside (`keep`: undefined when nobody can). */
export class CrashGuard {
  private checkpointed: Checkpointed | undefined;
  private readonly note = takeKeeperNote();
  readonly kept: Kept;
  readonly keep: OutsideKeep | undefined;

  constructor(
    named: ReadonlyMap<string, readonly number[]> | undefined,
    notifier: StoreNotifier,
    private readonly log: CrashLog,
  ) {
    this.kept = takeKept(named, this.note, log);
    this.keep = outsideKeep(notifier, this.kept, log) ?? undefined;
  }

  /** The kept state (undefined, logged, when it does not decode) once the requests that waited through a restart are answered. */
  async restore(): Promise<StateSnapshot | undefined> {
    await new Promise((resolve) => setImmediate(() => setImmediate(resolve))); // the second runs after the next poll
    const r = this.kept.state && decodeState(this.kept.state);
    if (r && !r.ok) this.log.warn({ err: r.error }, 'saved state not restored: starting fresh');
    const state = r?.ok ? r.value : undefined;
    reportCrash(this.kept, this.note, state, this.log);
    return state;
  }

  /** Checkpoints of `live` after every sample (a failure logged once per run of them; the last good one stays). */
  serving(live: Checkpointed | undefined): void {
    const keep = this.keep;
    if (keep === undefined) return;
    let failing = false;
    live?.checkpointTo((state) => {
      try {
        if (state instanceof Error) throw state;
        keep.checkpoint(state);
        failing = false;
      } catch (e) {
        if (!failing)
          this.log.warn({ err: (e as Error).message }, `cannot checkpoint the live state: the ${keep.holder} keeps the last one`);
        failing = true;
      }
    });
    this.checkpointed = live;
    keep.ready();
  }

  /** No more checkpoints; connections closed from now on stay held. */
  stopping(): void {
    this.checkpointed?.checkpointTo(null);
    this.keep?.detach();
  }
}
