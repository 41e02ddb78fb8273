/**
 * IncompleteFrames: the budget over all connections and the deadline of one incomplete frame. The
 * connections waiting to be read are Unread records (the interface the server builds on a paused socket).
 */
import { afterEach, describe, expect, it } from 'vitest';
import { IncompleteFrames, IncompleteHold, READ_CHUNK, type CutReason, type Unread } from '../../../src/helper/server/incomplete-frames.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** An Unread of `hold`'s connection (its uid) that records what was done to it. */
function unread(hold: IncompleteHold, o: { hungUp?: boolean } = {}): Unread & { resumed: number; destroyedBy: boolean } {
  return {
    hold,
    resumed: 0,
    destroyedBy: false,
    resume() {
      this.resumed++;
    },
    destroy() {
      this.destroyedBy = true;
    },
    get destroyed() {
      return this.destroyedBy;
    },
    hungUp: () => o.hungUp === true,
  };
}

const releases: (() => void)[] = [];
afterEach(() => {
  for (const r of releases.splice(0)) r();
});

function holdOf(frames: IncompleteFrames, expired: (why: CutReason) => void = () => {}, uid = 0) {
  const h = new IncompleteHold(frames, expired, uid);
  releases.push(() => h.set(0));
  return h;
}

describe('IncompleteFrames budget', () => {
  it('counts what every connection holds and says false once the total passes maxBytes', () => {
    const frames = new IncompleteFrames({ maxBytes: 100, deadlineMs: 60_000 });
    const a = holdOf(frames);
    const b = holdOf(frames);
    expect(a.set(60)).toBe(true);
    expect(b.fits(40)).toBe(true);
    expect(b.fits(41)).toBe(false);
    expect(b.set(41)).toBe(false);
    expect(frames.heldBytes).toBe(101);
    // Setting 0 always succeeds: a connection that completes its frame is never refused.
    expect(b.set(0)).toBe(true);
    expect(frames.heldBytes).toBe(60);
  });

  it('counts a connection once however often it reports, and forgets it at release, twice or not', () => {
    const frames = new IncompleteFrames({ maxBytes: 100, deadlineMs: 60_000 });
    const a = holdOf(frames);
    a.set(10);
    a.set(30);
    expect(frames.heldBytes).toBe(30);
    a.set(0);
    a.set(0);
    expect(frames.heldBytes).toBe(0);
  });

  it('starts reading a new connection when a chunk fits, and queues it when one does not', () => {
    const frames = new IncompleteFrames({ maxBytes: 2 * READ_CHUNK, deadlineMs: 60_000 });
    const first = unread(holdOf(frames));
    expect(frames.startReading(first)).toBe(true);
    expect(first.resumed).toBe(1);
    const h = holdOf(frames);
    h.set(READ_CHUNK + 1);
    const second = unread(holdOf(frames));
    expect(frames.startReading(second)).toBe(false);
    expect(second.resumed).toBe(0);
    expect(frames.waitingConnections).toBe(1);
  });

  it('resumes waiting connections in order once held bytes leave, as many as the room has chunks for', () => {
    const frames = new IncompleteFrames({ maxBytes: 3 * READ_CHUNK, deadlineMs: 60_000 });
    const h = holdOf(frames);
    h.set(3 * READ_CHUNK);
    const [a, b, c] = [unread(holdOf(frames)), unread(holdOf(frames)), unread(holdOf(frames))];
    for (const u of [a, b, c]) expect(frames.startReading(u)).toBe(false);
    h.set(READ_CHUNK); // room for two chunks
    expect([a.resumed, b.resumed, c.resumed]).toEqual([1, 1, 0]);
    expect(frames.waitingConnections).toBe(1);
    // A queued connection behind others waits even with room: nobody jumps the queue.
    expect(frames.startReading(unread(holdOf(frames)))).toBe(false);
  });

  it('skips a waiting connection already closed and closes one whose client hung up, without spending room on them', () => {
    const frames = new IncompleteFrames({ maxBytes: 2 * READ_CHUNK, deadlineMs: 60_000 });
    const h = holdOf(frames);
    h.set(2 * READ_CHUNK);
    const gone = unread(holdOf(frames));
    const hungUp = unread(holdOf(frames), { hungUp: true });
    const live = unread(holdOf(frames));
    for (const u of [gone, hungUp, live]) frames.startReading(u);
    gone.destroy();
    h.set(READ_CHUNK); // room for one chunk
    expect(gone.resumed).toBe(0);
    expect(hungUp.resumed).toBe(0);
    expect(hungUp.destroyedBy).toBe(true);
    expect(live.resumed).toBe(1);
    expect(frames.waitingConnections).toBe(0);
  });

  it('promises a chunk to each connection started reading until its first bytes come or it closes, however many start at once', () => {
    const frames = new IncompleteFrames({ maxBytes: 3 * READ_CHUNK, deadlineMs: 60_000 });
    const conns = [0, 1, 2, 3, 4].map(() => unread(holdOf(frames)));
    // Started together, before any of them is read (the listener accepts many in one turn): three chunks of room, three started.
    expect(conns.map((u) => frames.startReading(u))).toEqual([true, true, true, false, false]);
    expect(frames.promisedBytes).toBe(3 * READ_CHUNK);
    // A full chunk read by each of them stays within the budget.
    for (const u of conns.slice(0, 3)) expect(u.hold.set(READ_CHUNK)).toBe(true);
    expect(frames.promisedBytes).toBe(0);
    expect(frames.heldBytes).toBe(3 * READ_CHUNK);
    // One completes its frame: its room starts the first waiting connection, promised a chunk in turn.
    conns[0]!.hold.set(0);
    expect(conns[3]!.resumed).toBe(1);
    expect(frames.promisedBytes).toBe(READ_CHUNK);
    // That one closes before any byte (the server sets 0 at close): its promise goes, and the last one starts.
    conns[3]!.hold.set(0);
    expect(conns[4]!.resumed).toBe(1);
    expect(frames.promisedBytes).toBe(READ_CHUNK);
    expect(frames.waitingConnections).toBe(0);
  });

  it('no longer waits for a connection it was told to forget', () => {
    const frames = new IncompleteFrames({ maxBytes: READ_CHUNK, deadlineMs: 60_000 });
    const h = holdOf(frames);
    h.set(1);
    const u = unread(holdOf(frames));
    frames.startReading(u);
    frames.forget(u);
    h.set(0);
    expect(u.resumed).toBe(0);
    expect(frames.waitingConnections).toBe(0);
  });
});

describe('IncompleteFrames shared between users', () => {
  const ATTACKER = 65534;
  const QEMU = 107;

  it('reads a new connection of a user holding less at once when the budget is full, cutting the oldest frames of the user holding the most', () => {
    const frames = new IncompleteFrames({ maxBytes: 4 * READ_CHUNK, deadlineMs: 60_000 });
    const cut: string[] = [];
    const held = [0, 1, 2, 3].map((i) => holdOf(frames, (why) => cut.push(`${i} ${why}`), ATTACKER));
    for (const h of held) h.set(READ_CHUNK);
    // The attacker's next connection waits: it holds the most already.
    const more = unread(holdOf(frames, () => {}, ATTACKER));
    expect(frames.startReading(more)).toBe(false);
    const q = holdOf(frames, () => cut.push('qemu'), QEMU);
    const qemu = unread(q);
    expect(frames.startReading(qemu)).toBe(true);
    expect(qemu.resumed).toBe(1);
    expect(cut).toEqual(['0 evicted']); // one chunk of room was needed: the oldest frame went
    expect(frames.heldBy(ATTACKER)).toBe(3 * READ_CHUNK);
    // QEMU's bytes fit as they come, taken from the attacker again when the budget is full.
    expect(q.set(READ_CHUNK + 5)).toBe(true);
    expect(cut).toEqual(['0 evicted', '1 evicted']);
    expect(frames.heldBytes).toBeLessThanOrEqual(4 * READ_CHUNK);
  });

  it('never cuts the frames of a user holding no more than the one asking: that connection waits', () => {
    const frames = new IncompleteFrames({ maxBytes: 2 * READ_CHUNK, deadlineMs: 60_000 });
    const cut: string[] = [];
    holdOf(frames, () => cut.push('a'), 1).set(READ_CHUNK);
    const b = holdOf(frames, () => cut.push('b'), 2);
    b.set(READ_CHUNK);
    // User 2 holds as much as user 1: a connection of user 2 may not take from user 1.
    expect(frames.startReading(unread(holdOf(frames, () => {}, 2)))).toBe(false);
    expect(b.set(READ_CHUNK + 1)).toBe(false); // nor may its bytes: over the budget, closed by the caller
    expect(cut).toEqual([]);
  });

  it('resumes waiting connections one user after another, not in the order they came', () => {
    const frames = new IncompleteFrames({ maxBytes: 2 * READ_CHUNK, deadlineMs: 60_000 });
    // Users 8 and 9 hold a chunk each: neither holds more than the other would, so nobody is cut.
    holdOf(frames, () => {}, 8).set(READ_CHUNK);
    const h9 = holdOf(frames, () => {}, 9);
    h9.set(READ_CHUNK);
    const flood = [0, 1, 2].map(() => unread(holdOf(frames, () => {}, 9)));
    for (const u of flood) expect(frames.startReading(u)).toBe(false);
    const late = unread(holdOf(frames, () => {}, 8));
    expect(frames.startReading(late)).toBe(false);
    h9.set(0); // room for one chunk: user 8's connection, not the first of user 9's that came before it
    expect(late.resumed).toBe(1);
    expect(flood.map((u) => u.resumed)).toEqual([0, 0, 0]);
  });

  it('shares the room made by a cut with the waiting connections, keeping a chunk for the one that asked', () => {
    const frames = new IncompleteFrames({ maxBytes: 3 * READ_CHUNK, deadlineMs: 60_000 });
    const h = holdOf(frames, () => {}, 9);
    h.set(3 * READ_CHUNK);
    const flood = [0, 1, 2].map(() => unread(holdOf(frames, () => {}, 9)));
    for (const u of flood) expect(frames.startReading(u)).toBe(false);
    const other = unread(holdOf(frames, () => {}, 5));
    // User 9's only frame is as large as the budget: it is cut for user 5, which holds nothing.
    expect(frames.startReading(other)).toBe(true);
    expect(frames.heldBy(9)).toBe(0);
    expect(flood.map((u) => u.resumed)).toEqual([1, 1, 0]);
  });
});

describe('IncompleteFrames deadline', () => {
  it('expires a frame still incomplete deadlineMs after its first byte, however many bytes follow', async () => {
    const frames = new IncompleteFrames({ maxBytes: 1000, deadlineMs: 60 });
    let expired = 0;
    const h = holdOf(frames, () => expired++);
    h.set(1);
    await sleep(30);
    h.set(2); // more bytes do not push the deadline back
    await sleep(45);
    expect(expired).toBe(1);
  });

  it('does not expire a frame completed in time, and starts afresh with the next one', async () => {
    const frames = new IncompleteFrames({ maxBytes: 1000, deadlineMs: 60 });
    let expired = 0;
    const h = holdOf(frames, () => expired++);
    h.set(5);
    await sleep(30);
    h.set(0);
    await sleep(45);
    expect(expired).toBe(0);
    h.set(3);
    await sleep(40);
    expect(expired).toBe(0);
    await sleep(40);
    expect(expired).toBe(1);
  });

  it('calls what onExpire set instead of the first callback, and nothing after release', async () => {
    const frames = new IncompleteFrames({ maxBytes: 1000, deadlineMs: 30 });
    const calls: string[] = [];
    const h = holdOf(frames, () => calls.push('first'));
    h.onExpire(() => calls.push('second'));
    h.set(1);
    await sleep(50);
    expect(calls).toEqual(['second']);
    h.set(1);
    h.set(0);
    h.set(0);
    await sleep(50);
    expect(calls).toEqual(['second']);
  });
});
