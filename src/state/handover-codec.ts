/** The hand-over section (format version 4 on), at the payload's end, its length in the header's last field (0: a checkpoint). */
import { firstTime, type Io } from './byte-io.js';
import type { HandedConnection, Handover } from './snapshot.js';

/** Connections one record may list (the daemon's --max-connections bound). */
const MAX_HANDED_CONNECTIONS = 1 << 20;
/** Bytes read and not answered, per connection: the start of a request and what Node's stream read ahead (up to 64 KiB). */
const MAX_PENDING_BYTES = 256 * 1024;
const KINDS = [null, 'legacy', 'undecided'] as const;

/** Why a hand-over cannot be written or used, or null; the writer refuses a value out of its field's range. */
export function handoverProblem(h: Handover): string | null {
  const once = firstTime();
  for (const c of h.connections) {
    if (c.ino === 0n) return `socket inode ${c.ino} is out of range`;
    if (!once(c.ino)) return `socket inode ${c.ino} is listed twice`;
    if (KINDS.indexOf(c.kind) < 1) return `connection ${c.ino} has an unknown kind`;
    if (c.pending.length > MAX_PENDING_BYTES)
      return `connection ${c.ino} holds ${c.pending.length} pending bytes, at most ${MAX_PENDING_BYTES}`;
  }
  return null;
}

export function handoverIo(io: Io, h?: Handover): Handover {
  const at = 'the hand-over';
  const writtenNs = io.u64(h?.writtenNs, at);
  const counter = (k: keyof Handover['legacy']) => io.safe(h?.legacy[k], `the legacy ${k} counter`);
  const legacy = { ok: counter('ok'), refused: counter('refused'), failed: counter('failed') };
  // An unknown kind, too many pending bytes: refused by handoverProblem (bytes() allocates no more than the record holds).
  const connections = io.list(4, h?.connections, MAX_HANDED_CONNECTIONS, 13, 'handed-over connections', (c) => ({
    ino: io.u64(c?.ino, at),
    kind: KINDS[io.u8(c && KINDS.indexOf(c.kind), at)] as HandedConnection['kind'], // 1 legacy, 2 undecided
    pending: io.bytes(c?.pending, io.u32(c?.pending.length, at), at),
  }));
  return h ?? { writtenNs, legacy, connections };
}
