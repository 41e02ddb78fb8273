import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { keptFds, MAX_GATED_READS, ProcTaskReader } from '../../src/os/proc-tasks.js';
import { parseStatLine, statNumThreads } from '../../src/ratio/stat.js';
import { ThreadedProcess, openFdCount, procFdsOf } from '../support/threads.js';

const procs: ThreadedProcess[] = [];
async function proc(): Promise<ThreadedProcess> {
  const p = new ThreadedProcess();
  procs.push(p);
  await p.ready();
  return p;
}
afterEach(async () => {
  for (const p of procs.splice(0)) await p.kill();
});

describe('ProcTaskReader on real processes', () => {
  test('reads every thread, and the lines match /proc', async () => {
    const p = await proc();
    await p.cmd('start 5');
    const r = new ProcTaskReader('/proc');
    try {
      const lines = r.read(p.pid)!;
      expect([...lines.keys()].sort((a, b) => a - b)).toEqual(p.tids());
      expect(lines.size).toBeGreaterThanOrEqual(6);
      for (const [tid, line] of lines) {
        expect(line.endsWith('\n')).toBe(false);
        const parsed = parseStatLine(line);
        expect(parsed.ok).toBe(true);
        if (!parsed.ok) continue;
        const st = parsed.value;
        expect(st.tid).toBe(tid);
        const direct = fs.readFileSync(`/proc/${p.pid}/task/${tid}/stat`, 'latin1').trimEnd();
        // sleeping threads: every field but the moving ones is identical; starttime and comm always are
        const parsedDirect = parseStatLine(direct);
        if (!parsedDirect.ok) throw new Error(parsedDirect.error);
        const d = parsedDirect.value;
        expect(st.starttime).toBe(d.starttime);
        expect(st.comm).toBe(d.comm);
        expect(line.split(' ').length).toBe(direct.split(' ').length);
      }
      expect(statNumThreads(lines.get(p.pid)!)).toBe(lines.size);
    } finally {
      r.close();
    }
  });

  test('re-reads through kept fds: no listing while the thread count is unchanged', async () => {
    const p = await proc();
    await p.cmd('start 3');
    const r = new ProcTaskReader('/proc', { relistEvery: 1000 });
    try {
      r.read(p.pid);
      const listings = r.cost.listings;
      for (let i = 0; i < 5; i++) expect(r.read(p.pid)!.size).toBe(p.tids().length);
      expect(r.cost.listings).toBe(listings);
      await p.cmd('start 2');
      expect([...r.read(p.pid)!.keys()].sort((a, b) => a - b)).toEqual(p.tids());
      expect(r.cost.listings).toBeGreaterThan(listings);
    } finally {
      r.close();
    }
  });

  test('picks up a replacement thread when the count stays the same', async () => {
    const p = await proc();
    await p.cmd('start 2');
    const r = new ProcTaskReader('/proc', { relistEvery: 1000 });
    try {
      const before = r.read(p.pid)!;
      await p.cmd('stop 1');
      await p.cmd('start 1');
      const after = r.read(p.pid)!;
      expect([...after.keys()].sort((a, b) => a - b)).toEqual(p.tids());
      expect(after.size).toBe(before.size);
    } finally {
      r.close();
    }
  });

  test('threads that exit disappear and their fds are closed; fd count stays bounded', async () => {
    const p = await proc();
    const r = new ProcTaskReader('/proc', { relistEvery: 1000 });
    const fds0 = openFdCount();
    try {
      for (let round = 0; round < 5; round++) {
        await p.cmd('start 20');
        expect(r.read(p.pid)!.size).toBe(p.tids().length);
        await p.cmd('stop 20');
        const lines = r.read(p.pid)!;
        expect([...lines.keys()].sort((a, b) => a - b)).toEqual(p.tids());
        expect(r.openFds).toBe(keptFds(lines.size));
        expect(procFdsOf(p.pid)).toBe(keptFds(lines.size));
      }
      expect(openFdCount() - fds0).toBeLessThanOrEqual(r.openFds);
    } finally {
      r.close();
    }
    expect(openFdCount()).toBeLessThanOrEqual(fds0);
  });

  test('a process that exits gives null, and every fd is released', async () => {
    const p = await proc();
    await p.cmd('start 4');
    const r = new ProcTaskReader('/proc');
    const n = r.read(p.pid)!.size;
    expect(n).toBeGreaterThanOrEqual(5);
    expect(procFdsOf(p.pid)).toBe(keptFds(n));
    await p.kill();
    // a reaped process: its kept fds now fail with ESRCH
    expect(r.read(p.pid)).toBeNull();
    expect(r.openFds).toBe(0);
    expect(procFdsOf(p.pid)).toBe(0);
    r.close();
  });

  test('a pid that does not exist, or a nonsense pid, gives null', () => {
    const r = new ProcTaskReader('/proc');
    expect(r.read(0x7ffffffe)).toBeNull();
    expect(r.read(-1)).toBeNull();
    expect(r.read(Number.NaN)).toBeNull();
    expect(r.openFds).toBe(0);
  });

  test('forget closes the fds of one pid only', async () => {
    const a = await proc();
    const b = await proc();
    const r = new ProcTaskReader('/proc');
    try {
      const na = r.read(a.pid)!.size;
      const nb = r.read(b.pid)!.size;
      expect(r.openFds).toBe(keptFds(na) + keptFds(nb));
      r.forget(a.pid);
      expect(r.openFds).toBe(keptFds(nb));
      expect(r.read(a.pid)!.size).toBe(na);
    } finally {
      r.close();
    }
    expect(r.openFds).toBe(0);
  });

  test('a sleeping thread read again gives the same line, equal to what /proc says now', async () => {
    const p = await proc();
    await p.cmd('start 3');
    // A thread just started runs on a moment before it waits: read once every one shows S.
    const state = (tid: number) => fs.readFileSync(`/proc/${p.pid}/task/${tid}/stat`, 'latin1').split(') ').pop()![0];
    const deadline = Date.now() + 3000;
    while (p.tids().some((t) => t !== p.pid && state(t) !== 'S')) {
      if (Date.now() > deadline) throw new Error('threads still not asleep after 3 s');
      await new Promise((res) => setTimeout(res, 10));
    }
    const r = new ProcTaskReader('/proc', { relistEvery: 1000 });
    try {
      const first = r.read(p.pid)!;
      const again = r.read(p.pid)!;
      for (const [tid, line] of again) {
        if (tid === p.pid) continue; // the main thread reads our commands: it may move
        expect(line).toBe(first.get(tid));
        expect(line).toBe(fs.readFileSync(`/proc/${p.pid}/task/${tid}/stat`, 'latin1').trimEnd());
      }
    } finally {
      r.close();
    }
  });

  test('tick counts move between reads of a spinning thread (fresh data, not a cached line)', async () => {
    const p = await proc();
    await p.cmd('spin');
    const r = new ProcTaskReader('/proc');
    try {
      const ticks = (m: Map<number, string>) =>
        [...m.values()].map((l) => parseStatLine(l)).reduce((a, s) => a + (s.ok ? s.value.utime + s.value.stime : 0), 0);
      const t0 = ticks(r.read(p.pid)!);
      await new Promise((res) => setTimeout(res, 300));
      expect(ticks(r.read(p.pid)!)).toBeGreaterThan(t0);
    } finally {
      r.close();
    }
  });
});

describe('ProcTaskReader gates on real processes', () => {
  const fromProc = (pid: number, tid: number) => fs.readFileSync(`/proc/${pid}/task/${tid}/stat`, 'latin1').trimEnd();
  const ticksOf = (line: string) => {
    const st = parseStatLine(line);
    if (!st.ok) throw new Error(st.error);
    return st.value.utime + st.value.stime;
  };
  const newTid = async (p: ThreadedProcess, cmd: string) => {
    const before = new Set(p.tids());
    await p.cmd(cmd);
    return p.tids().find((t) => !before.has(t))!;
  };

  /** Reads until `done` says a read was answered as the test wants (threads just started may still run); fails after 3 s. */
  async function readUntil(
    r: ProcTaskReader,
    p: ThreadedProcess,
    what: string,
    done: (d: ProcTaskReader['cost']) => boolean,
  ): Promise<Map<number, string>> {
    const deadline = Date.now() + 3000;
    for (;;) {
      const before = { ...r.cost };
      const lines = r.read(p.pid)!;
      const d = {
        statReads: r.cost.statReads - before.statReads,
        probes: r.cost.probes - before.probes,
        gatedReads: r.cost.gatedReads - before.gatedReads,
        gatedProcessReads: r.cost.gatedProcessReads - before.gatedProcessReads,
        listings: r.cost.listings - before.listings,
      };
      if (done(d)) return lines;
      if (Date.now() > deadline) throw new Error(`${what}: not seen in 3 s (last read: ${JSON.stringify(d)})`);
      await new Promise((res) => setTimeout(res, 20));
    }
  }
  /** The process gate answered: no line read, no probe. */
  const processGated = (d: ProcTaskReader['cost']) => d.gatedProcessReads === 1 && d.statReads === 0 && d.probes === 0;

  test('a process none of whose threads ran since the last read: no line is read, and every line is what /proc says now', async () => {
    const p = await proc();
    await p.cmd('start 3');
    const r = new ProcTaskReader('/proc', { relistEvery: 1000 });
    try {
      const lines = await readUntil(r, p, 'a read answered by the process gate', processGated);
      expect(lines.size).toBe(4);
      for (const [tid, line] of lines) expect(line).toBe(fromProc(p.pid, tid));
      expect(r.read(p.pid)).toBe(lines); // the same map again: nothing allocated for an idle process
    } finally {
      r.close();
    }
  });

  test('a thread that ran since its line was read is read again: fresh ticks, equal to /proc', async () => {
    const p = await proc();
    const burner = await newTid(p, 'burner');
    const r = new ProcTaskReader('/proc', { relistEvery: 1000 });
    try {
      const gated = (await readUntil(r, p, 'a read answered by the process gate', processGated)).get(burner)!;
      for (let i = 0; i < 3; i++) await p.cmd('burn'); // 150 ms of CPU: at least one more tick
      const before = { ...r.cost };
      const fresh = r.read(p.pid)!.get(burner)!;
      expect(r.cost.gatedProcessReads - before.gatedProcessReads).toBe(0);
      expect(r.cost.gatedReads - before.gatedReads).toBeLessThan(p.tids().length - 1); // the burner was not gated
      expect(fresh).toBe(fromProc(p.pid, burner));
      expect(ticksOf(fresh)).toBeGreaterThan(ticksOf(gated));
    } finally {
      r.close();
    }
  });

  test('a thread born while the process gate is closed is read', async () => {
    const p = await proc();
    await p.cmd('start 2');
    const r = new ProcTaskReader('/proc', { relistEvery: 1000 });
    try {
      await readUntil(r, p, 'a read answered by the process gate', processGated);
      const born = await newTid(p, 'start 1');
      const lines = r.read(p.pid)!;
      expect([...lines.keys()].sort((a, b) => a - b)).toEqual(p.tids());
      expect(lines.get(born)).toBe(fromProc(p.pid, born));
    } finally {
      r.close();
    }
  });

  test('a process that exits while the process gate is closed gives null, and every fd is released', async () => {
    const p = await proc();
    await p.cmd('start 2');
    const r = new ProcTaskReader('/proc', { relistEvery: 1000 });
    await readUntil(r, p, 'a read answered by the process gate', processGated);
    await p.kill();
    expect(r.read(p.pid)).toBeNull();
    expect(r.openFds).toBe(0);
    expect(procFdsOf(p.pid)).toBe(0);
    r.close();
  });

  test('in a process that keeps running, a sleeping thread is served by its schedstat without a stat read, and its line is what /proc says now', async () => {
    const p = await proc();
    await p.cmd('start 3');
    await p.cmd('spin'); // always running: the process gate never answers
    const r = new ProcTaskReader('/proc', { relistEvery: 1000 });
    try {
      const sleepers = p.tids().length - 2;
      const lines = await readUntil(
        r,
        p,
        'every sleeper answered by the thread gate',
        (d) => d.gatedReads === sleepers && d.gatedProcessReads === 0,
      );
      for (const tid of p.tids().slice(1, 4)) expect(lines.get(tid)).toBe(fromProc(p.pid, tid));
    } finally {
      r.close();
    }
  });

  test('a thread that runs between every read stops being probed for a while, and every line stays fresh', async () => {
    const p = await proc();
    const burner = await newTid(p, 'burner');
    const r = new ProcTaskReader('/proc', { relistEvery: 1000 });
    try {
      r.read(p.pid);
      const probes0 = r.cost.probes;
      const reads = 12;
      for (let i = 0; i < reads; i++) {
        await p.cmd('burn');
        expect(r.read(p.pid)!.get(burner)).toBe(fromProc(p.pid, burner));
      }
      // probed until it ran twice in a row, then read directly: fewer probes than reads of the burner
      // (the process's other threads, idle, are probed every time: count the burner's share only)
      const others = p.tids().length - 2;
      expect(r.cost.probes - probes0 - others * reads).toBeLessThan(reads / 2);
    } finally {
      r.close();
    }
  });

  test(`a sleeping thread's line is read again after ${MAX_GATED_READS} reads answered by a gate`, async () => {
    const p = await proc();
    await p.cmd('start 1');
    const sleeper = p.tids().find((t) => t !== p.pid)!;
    const r = new ProcTaskReader('/proc', { relistEvery: 1000 });
    try {
      await readUntil(r, p, 'a read answered by the process gate', processGated);
      const stat0 = r.cost.statReads;
      const reads = 3 * (MAX_GATED_READS + 1);
      for (let i = 0; i < reads; i++) expect(r.read(p.pid)!.get(sleeper)).toBe(fromProc(p.pid, sleeper));
      // once per MAX_GATED_READS + 1 reads (where the run starts is not known), with the main thread
      const sleeperReads = (r.cost.statReads - stat0) / 2;
      expect(sleeperReads).toBeGreaterThanOrEqual(2);
      expect(sleeperReads).toBeLessThanOrEqual(3);
    } finally {
      r.close();
    }
  });

  test('idle processes first read together reach their forced full read in different intervals, not all in one', async () => {
    const ps = await Promise.all(Array.from({ length: 6 }, () => proc()));
    await Promise.all(ps.map((p) => p.cmd('start 2')));
    const r = new ProcTaskReader('/proc', { relistEvery: 1000 });
    try {
      for (const p of ps) await readUntil(r, p, 'a read answered by the process gate', processGated);
      // Every process is read once per interval, as the sampler does; count the lines read in each.
      const perInterval: number[] = [];
      for (let i = 0; i < 2 * (MAX_GATED_READS + 1); i++) {
        const before = r.cost.statReads;
        for (const p of ps) r.read(p.pid);
        perInterval.push(r.cost.statReads - before);
      }
      const total = perInterval.reduce((a, b) => a + b, 0);
      // Each process is read in full (3 lines) once or twice in that time...
      expect(total).toBeGreaterThanOrEqual(ps.length * 3);
      // ...and never more than two of them in the same interval (all six at once without the stagger).
      expect(Math.max(...perInterval)).toBeLessThanOrEqual(2 * 3);
    } finally {
      r.close();
    }
  });

  test("the process gate stays off for a /proc whose pids are not this namespace's (its self is another pid); the thread gate still answers", async () => {
    const p = await proc();
    await p.cmd('start 2'); // idle: under our own /proc the process gate would answer, not the thread gate
    const root = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-otherproc-'));
    try {
      fs.symlinkSync(`/proc/${p.pid}`, path.join(root, String(p.pid)));
      fs.symlinkSync('1', path.join(root, 'self')); // as a host's /proc seen from a container
      const r = new ProcTaskReader(root, { relistEvery: 1000 });
      try {
        const lines = await readUntil(
          r,
          p,
          'the sleepers answered by the thread gate',
          (d) => d.gatedReads === 2 && d.gatedProcessReads === 0,
        );
        expect(r.cost.gatedProcessReads).toBe(0);
        expect(lines.size).toBe(p.tids().length);
      } finally {
        r.close();
      }
    } finally {
      fs.rmSync(root, { recursive: true, force: true });
    }
  });

  test('with the gates off every line is read every time and no schedstat fd is held', async () => {
    const p = await proc();
    await p.cmd('start 3');
    const r = new ProcTaskReader('/proc', { relistEvery: 1000, gate: false });
    try {
      const n = r.read(p.pid)!.size;
      r.read(p.pid);
      expect(r.cost.probes).toBe(0);
      expect(r.cost.gatedProcessReads).toBe(0);
      expect(r.cost.statReads).toBe(2 * n);
      expect(r.openFds).toBe(n);
      expect(procFdsOf(p.pid)).toBe(n);
    } finally {
      r.close();
    }
  });
});
