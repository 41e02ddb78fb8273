import fs from 'node:fs';
import { afterEach, describe, expect, test } from 'vitest';
import { ProcTaskReader } from '../../src/os/proc-tasks.js';
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
      const listings = r.listings;
      for (let i = 0; i < 5; i++) expect(r.read(p.pid)!.size).toBe(p.tids().length);
      expect(r.listings).toBe(listings);
      await p.cmd('start 2');
      expect([...r.read(p.pid)!.keys()].sort((a, b) => a - b)).toEqual(p.tids());
      expect(r.listings).toBeGreaterThan(listings);
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
        expect(r.openFds).toBe(lines.size);
        expect(procFdsOf(p.pid)).toBe(lines.size);
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
    expect(procFdsOf(p.pid)).toBe(n);
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
      expect(r.openFds).toBe(na + nb);
      r.forget(a.pid);
      expect(r.openFds).toBe(nb);
      expect(r.read(a.pid)!.size).toBe(na);
    } finally {
      r.close();
    }
    expect(r.openFds).toBe(0);
  });

  test('a sleeping thread read again gives the same line, equal to what /proc says now', async () => {
    const p = await proc();
    await p.cmd('start 3');
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
