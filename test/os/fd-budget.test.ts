import fs from 'node:fs';
import { describe, expect, it } from 'vitest';
import { countOpenFds, effectiveMaxConnections, FD_RESERVE, FdBudget, vmFds } from '../../src/budget/fd-budget.js';

describe('FdBudget', () => {
  it('admits a VM only when its threads fit beside open fds, free connection slots and the reserve', () => {
    let open = 100;
    let conns = 10;
    const b = new FdBudget({ limit: 1024, maxConnections: 400, openConnections: () => conns, openFds: () => open });
    // room = 1024 - 100 - (400 - 10) - 32 = 502; a VM of n threads needs 2n (stat and schedstat, none for the main thread's schedstat, one listing)
    expect(b.canAdmit(251)).toEqual({ ok: true, value: undefined });
    const no = b.canAdmit(252);
    expect(no.ok).toBe(false);
    expect(!no.ok && no.error).toBe(
      "not enough file descriptors: its 252 threads need 504, 502 are left (limit 1024, 100 open, 390 kept for connections, 32 reserved); raise the helper's open-file limit (LimitNOFILE=, ulimit -n) or lower --max-connections",
    );
    // connections that exist are in `open` already: their slots are not counted twice
    open = 490;
    conns = 400;
    expect(b.canAdmit(251)).toEqual({ ok: true, value: undefined });
    expect(vmFds(10)).toBe(20);
  });

  it('lets statistics files open fds only while they fit beside the connection slots and the reserve', () => {
    const b = new FdBudget({ limit: 1024, maxConnections: 400, openConnections: () => 10, openFds: () => 100 });
    // room = 1024 - 100 - 390 - 32 = 502
    expect(b.canOpen(502, 'the statistics file of VM 1')).toEqual({ ok: true, value: undefined });
    const no = b.canOpen(503, 'the statistics file of VM 1');
    expect(!no.ok && no.error).toBe(
      "not enough file descriptors: the statistics file of VM 1 needs 503, 502 are left (limit 1024, 100 open, 390 kept for connections, 32 reserved); raise the helper's open-file limit (LimitNOFILE=, ulimit -n) or lower --max-connections",
    );
  });

  it('lowers --max-connections to half of what the limit leaves, never below 1', () => {
    expect(effectiveMaxConnections(4096, 1 << 20, 30)).toBe(4096);
    expect(effectiveMaxConnections(4096, 256, 30)).toBe(Math.floor((256 - 30 - FD_RESERVE) / 2));
    expect(effectiveMaxConnections(4096, 40, 30)).toBe(1);
  });
});

describe('FdBudget on the real /proc/self/fd', () => {
  it('counts the open fds once per event-loop turn, and counts what it admitted in that turn as open', async () => {
    const room = 10;
    const b = new FdBudget({ limit: countOpenFds() + FD_RESERVE + room, maxConnections: 1, openConnections: () => 1 });
    expect(b.canOpen(6, 'a file').ok).toBe(true);
    // No fd was opened, but 6 were admitted this turn: 6 more do not fit in the 10.
    expect(b.canOpen(6, 'a file').ok).toBe(false);
    await new Promise((r) => setImmediate(r));
    // A new turn counts again: the 6 were never opened.
    expect(b.canOpen(6, 'a file').ok).toBe(true);
  });

  it('reports its usage from a count under 10 s old, what it admitted included, and counts again after', async () => {
    let now = 1_000_000;
    const realNow = Date.now;
    Date.now = () => now;
    try {
      const limit = countOpenFds() + FD_RESERVE + 100;
      const b = new FdBudget({ limit, maxConnections: 0, openConnections: () => 0 });
      const first = b.usage();
      expect(first.max).toBe(limit);
      expect(first.open + first.available + FD_RESERVE).toBe(limit);
      expect(b.canOpen(5, 'a file').ok).toBe(true);
      await new Promise((r) => setImmediate(r));
      const held = [0, 1, 2].map(() => fs.openSync('/dev/null', 'r'));
      try {
        // A later turn, 9 s on: the last count stands (the 5 admitted in it included), the 3 just opened are not seen.
        now += 9_000;
        expect(b.usage()).toEqual({ ...first, open: first.open + 5, available: first.available - 5 });
        // Past 10 s it counts again: the 5 were never opened, the 3 are.
        now += 2_000;
        expect(b.usage()).toEqual({ ...first, open: first.open + 3, available: first.available - 3 });
      } finally {
        for (const fd of held) fs.closeSync(fd);
      }
    } finally {
      Date.now = realNow;
    }
  });

  it('sees the fds opened since the turn it last counted in', async () => {
    const b = new FdBudget({ limit: countOpenFds() + FD_RESERVE + 4, maxConnections: 1, openConnections: () => 1 });
    expect(b.canOpen(1, 'a file').ok).toBe(true);
    await new Promise((r) => setImmediate(r));
    const held = [0, 1, 2, 3].map(() => fs.openSync('/dev/null', 'r'));
    try {
      expect(b.canOpen(1, 'a file').ok).toBe(false);
    } finally {
      for (const fd of held) fs.closeSync(fd);
    }
  });
});
