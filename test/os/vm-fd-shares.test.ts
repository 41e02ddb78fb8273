import { afterEach, describe, expect, test } from 'vitest';
import { shareOf, UID_SHARE } from '../../src/budget/uid-share.js';
import { countOpenFds, FD_RESERVE, FdBudget, vmFds } from '../../src/budget/fd-budget.js';
import { shareOwnerOf } from '../../src/budget/preferred-owner.js';
import { keptFds, ProcTaskReader } from '../../src/os/proc-tasks.js';
import { VmFdShares } from '../../src/budget/vm-fd-shares.js';
import { getrlimit, RLIMIT_NOFILE, setrlimit } from '../../src/os/libc/processes.js';
import { ThreadedProcess, openFdCount } from '../support/threads.js';

const procs: ThreadedProcess[] = [];
afterEach(async () => {
  for (const p of procs.splice(0)) await p.kill();
});

async function threaded(n: number, uid?: number): Promise<ThreadedProcess> {
  const p = new ThreadedProcess(uid === undefined ? {} : { uid, gid: uid });
  procs.push(p);
  await p.ready();
  if (n > 1) await p.cmd(`start ${n - 1}`);
  return p;
}

/** A budget of `limit` fds with `open` open now and no connection slots. */
function budget(limit: number, open = 0): FdBudget {
  return new FdBudget({ limit, maxConnections: 0, openConnections: () => 0, openFds: () => open });
}

describe('VmFdShares', () => {
  test('a process over --max-vm-threads is sampled from that many threads (main first), reported not whole, and gains no thread later', async () => {
    const p = await threaded(20);
    const shares = new VmFdShares({ budget: budget(100_000), maxVmThreads: 8, owner: () => ({ uid: 0, preferred: true }) });
    const r = new ProcTaskReader('/proc', { ledger: shares });
    try {
      const lines = r.read(p.pid)!;
      expect(lines.size).toBe(8);
      expect(lines.has(p.pid)).toBe(true);
      expect(r.openFds).toBe(keptFds(8));
      expect(shares.heldBy(0)).toBe(r.openFds);
      expect(r.notWhole(p.pid)).toEqual({ threads: 20, sampled: 8, why: 'share' });
      await p.cmd('start 10');
      expect(r.read(p.pid)!.size).toBe(8);
      r.forget(p.pid);
      expect(shares.heldBy(0)).toBe(0);
    } finally {
      r.close();
    }
  });

  test("one uid's processes keep at most its share of the VMs' fds; a preferred owner's process is read whole beside them", async () => {
    const limit = 400;
    const shares = new VmFdShares({
      budget: budget(limit),
      maxVmThreads: 10_000,
      owner: (pid) => shareOwnerOf('/proc', pid, []),
    });
    const r = new ProcTaskReader('/proc', { ledger: shares });
    const share = shareOf(limit - FD_RESERVE, UID_SHARE);
    try {
      // Admitted small (as discovery admits them), then grown: what they keep stays in their share.
      const hogs = [await threaded(2, 65534), await threaded(2, 65534), await threaded(2, 65534)];
      for (const h of hogs) {
        expect(shares.canAdmit(2, h.pid).ok).toBe(true);
        r.read(h.pid);
      }
      for (const h of hogs) await h.cmd('start 38');
      for (const h of hogs) r.read(h.pid);
      expect(shares.heldBy(65534)).toBeLessThanOrEqual(share);
      expect(shares.heldBy(65534)).toBe(r.openFds);
      expect(hogs.filter((h) => r.notWhole(h.pid) !== null).length).toBeGreaterThan(0);
      const mine = await threaded(40);
      expect(r.read(mine.pid)!.size).toBe(40);
      expect(r.notWhole(mine.pid)).toBeNull();
    } finally {
      r.close();
    }
    expect(shares.heldBy(65534)).toBe(0);
  });

  test('canAdmit refuses a VM of a uid past its share, naming the share and the fix, and admits the same VM of root', async () => {
    const shares = new VmFdShares({ budget: budget(400), maxVmThreads: 10_000, owner: (pid) => shareOwnerOf('/proc', pid, []) });
    const r = new ProcTaskReader('/proc', { ledger: shares });
    try {
      const hog = await threaded(60, 65534);
      r.read(hog.pid);
      const next = await threaded(10, 65534);
      const no = shares.canAdmit(10, next.pid);
      expect(no.ok).toBe(false);
      if (!no.ok) expect(no.error).toMatch(/uid 65534 holds \d+ of the \d+ fds one uid may hold.*--socket-group.*LimitNOFILE=/);
      const mine = await threaded(10);
      expect(shares.canAdmit(10, mine.pid).ok).toBe(true);
    } finally {
      r.close();
    }
  });

  test('a VM admitted and opened in the same turn with little room left is sampled whole (its fds are counted once, not twice)', async () => {
    const p = await threaded(30);
    const need = vmFds(30);
    // The fds counted per event-loop turn, as the daemon counts them; room for the VM and 10 more.
    const b = new FdBudget({ limit: countOpenFds() + FD_RESERVE + need + 10, maxConnections: 0, openConnections: () => 0 });
    const shares = new VmFdShares({ budget: b, maxVmThreads: 10_000, owner: () => ({ uid: 0, preferred: true }) });
    const r = new ProcTaskReader('/proc', { ledger: shares });
    try {
      // As REGISTER and discovery do: admit, then open at once.
      expect(shares.canAdmit(30, p.pid).ok).toBe(true);
      expect(r.read(p.pid)!.size).toBe(30);
      expect(r.notWhole(p.pid)).toBeNull();
      // What it keeps is counted as open: 10 left, and the one fd of the task listing, closed again.
      expect(b.room()).toBeLessThanOrEqual(11);
    } finally {
      r.close();
    }
  });

  test('a process in a preferred group is a preferred owner; another user not in it is not', async () => {
    const other = await threaded(1, 65534);
    expect(shareOwnerOf('/proc', other.pid, [])).toEqual({ uid: 65534, preferred: false });
    expect(shareOwnerOf('/proc', other.pid, [65534])).toEqual({ uid: 65534, preferred: true });
    expect(shareOwnerOf('/proc', process.pid, [])).toEqual({ uid: 0, preferred: true });
    expect(shareOwnerOf('/proc', 0x7fffffff, [])).toBeNull();
  });
});

describe('ProcTaskReader out of fds', () => {
  test('an EMFILE while listing one process leaves it read from its threads (not whole), others read, and it is whole again once fds are free', async () => {
    const a = await threaded(2);
    const b = await threaded(2);
    const r = new ProcTaskReader('/proc');
    const saved = getrlimit(RLIMIT_NOFILE);
    try {
      expect(r.read(a.pid)!.size).toBe(2);
      expect(r.read(b.pid)!.size).toBe(2);
      await b.cmd('start 60');
      setrlimit(RLIMIT_NOFILE, { soft: openFdCount() + 8, hard: saved.hard });
      let lines: Map<number, string> | null;
      try {
        lines = r.read(b.pid);
        expect(r.read(a.pid)!.size).toBe(2);
      } finally {
        setrlimit(RLIMIT_NOFILE, saved);
      }
      expect(lines!.size).toBe(2);
      expect(r.notWhole(b.pid)).toMatchObject({ why: 'fds', sampled: 2 });
      expect(r.read(b.pid)!.size).toBe(62);
      expect(r.notWhole(b.pid)).toBeNull();
    } finally {
      r.close();
    }
  });
});
