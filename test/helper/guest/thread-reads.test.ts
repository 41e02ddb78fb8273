/**
 * ThreadReads (helper/guest/thread-reads.ts) on a real process: a window's end read through the
 * sampler's held fds (a real ProcTaskReader) gives what a fresh read of every stat file gives, leaves
 * out a thread that exited, and falls back to the path QEMU opens when a held fd fails; the next
 * window's start read after it lists nothing while the threads are the same, and lists again when
 * one is gone.
 */
import fs from 'node:fs';
import { afterEach, describe, expect, test } from 'vitest';
import { ThreadReads } from '../../../src/helper/guest/thread-reads.js';
import { TaskCount } from '../../../src/helper/guest/task-count.js';
import { ProcTaskReader } from '../../../src/os/proc-tasks.js';
import { ThreadedProcess } from '../../support/threads.js';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const PKG_OF_CPU = new Map([[0, 0]]);

async function proc(): Promise<ThreadedProcess> {
  const p = new ThreadedProcess();
  cleanups.push(() => p.kill());
  await p.ready();
  return p;
}

function sampler(pid: number): ProcTaskReader {
  const tasks = new ProcTaskReader('/proc');
  cleanups.push(() => tasks.close());
  expect(tasks.read(pid)).not.toBeNull();
  return tasks;
}

const ticksOf = (m: ReadonlyMap<number, { ticks: number }>) => new Map([...m].map(([tid, t]) => [tid, t.ticks]));

describe('ThreadReads', () => {
  test('readEnd gives the ticks a fresh read of every stat gives when one thread ran and others slept', async () => {
    const p = await proc();
    await p.cmd('start 3');
    await p.cmd('burner');
    const tasks = sampler(p.pid);
    const reads = new ThreadReads('/proc', PKG_OF_CPU, 64, (pid, tid) => tasks.heldFds(pid, tid));
    const start = reads.readStart(p.pid)!;
    expect(start.threads.size).toBe(p.tids().length - 1); // the main thread is left out, as QEMU leaves it out
    expect(start.threads.has(p.pid)).toBe(false);
    await p.cmd('burn'); // the burner runs 50 ms of CPU, then sleeps
    const end = reads.readEnd(p.pid, start).threads;
    const fresh = new ThreadReads('/proc', PKG_OF_CPU, 64).readStart(p.pid)!.threads;
    expect(ticksOf(end)).toEqual(ticksOf(fresh));
    const moved = [...end.values()].filter((t) => t.ticks > start.threads.get(t.tid)!.ticks);
    expect(moved.length).toBe(1); // the burner, read again
    // The sleepers' run times did not move: their start reads stand, with no stat read.
    for (const t of end.values()) if (t !== moved[0]) expect(t).toBe(start.threads.get(t.tid));
  });

  test('readEnd reads through the held fds alone when the sampler holds every thread', async () => {
    const p = await proc();
    await p.cmd('start 2');
    await p.cmd('burner');
    const tasks = sampler(p.pid);
    const start = new ThreadReads('/proc', PKG_OF_CPU, 64, (pid, tid) => tasks.heldFds(pid, tid)).readStart(p.pid)!;
    await p.cmd('burn');
    // No /proc under this root: a thread read by path would be missing.
    const held = new ThreadReads('/nonexistent-proc', PKG_OF_CPU, 64, (pid, tid) => tasks.heldFds(pid, tid));
    const end = held.readEnd(p.pid, start).threads;
    expect([...end.keys()].sort()).toEqual([...start.threads.keys()].sort());
    expect(ticksOf(end)).toEqual(ticksOf(new ThreadReads('/proc', PKG_OF_CPU, 64).readStart(p.pid)!.threads));
  });

  test('readStart after an end read with the same threads lists nothing, and reads again only the thread that ran', async () => {
    const p = await proc();
    await p.cmd('start 3');
    await p.cmd('burner');
    const tasks = sampler(p.pid);
    const held = (root: string) => new ThreadReads(root, PKG_OF_CPU, 64, (pid, tid) => tasks.heldFds(pid, tid));
    const end = held('/proc').readEnd(p.pid, held('/proc').readStart(p.pid)!);
    await p.cmd('burn');
    const count = TaskCount.open('/proc', p.pid)!;
    cleanups.push(() => count.close());
    // No /proc under this root: a listing would fail (null).
    const next = held('/nonexistent-proc').readStart(p.pid, undefined, { read: end, count: count.first })!;
    expect(next).not.toBeNull();
    expect(ticksOf(next.threads)).toEqual(ticksOf(new ThreadReads('/proc', PKG_OF_CPU, 64).readStart(p.pid)!.threads));
    const moved = [...next.threads.values()].filter((t) => t !== end.threads.get(t.tid));
    expect(moved.length).toBe(1); // the burner
  });

  test('readStart lists the threads again when one of the last read is gone, even with as many threads', async () => {
    const p = await proc();
    await p.cmd('start 2');
    const tasks = sampler(p.pid);
    const reads = new ThreadReads('/proc', PKG_OF_CPU, 64, (pid, tid) => tasks.heldFds(pid, tid));
    const end = reads.readEnd(p.pid, reads.readStart(p.pid)!);
    await p.cmd('stop 1');
    await p.cmd('start 1'); // one gone, one new: the count is the same
    const count = TaskCount.open('/proc', p.pid)!;
    cleanups.push(() => count.close());
    expect(count.first).toBe(end.threads.size + 1);
    const next = reads.readStart(p.pid, undefined, { read: end, count: count.first })!;
    expect([...next.threads.keys()].sort()).toEqual(
      p
        .tids()
        .filter((t) => t !== p.pid)
        .sort(),
    );
  });

  test('readEnd leaves out a thread that exited during the window', async () => {
    const p = await proc();
    await p.cmd('start 3');
    const tasks = sampler(p.pid);
    const reads = new ThreadReads('/proc', PKG_OF_CPU, 64, (pid, tid) => tasks.heldFds(pid, tid));
    const start = reads.readStart(p.pid)!;
    const before = p.tids();
    await p.cmd('stop 1');
    const gone = before.filter((t) => !p.tids().includes(t));
    expect(gone.length).toBe(1);
    const end = reads.readEnd(p.pid, start).threads;
    expect(end.has(gone[0]!)).toBe(false);
    expect(end.size).toBe(start.threads.size - 1);
  });

  test('readEnd reads a thread by its path, as QEMU does, when its held fd fails', async () => {
    const p = await proc();
    const started = async () => {
      const before = p.tids();
      await p.cmd('start 1');
      return p.tids().find((t) => !before.includes(t))!;
    };
    const a = await started();
    const b = await started(); // the last started: the one 'stop 1' ends
    const dead = fs.openSync(`/proc/${p.pid}/task/${b}/stat`, 'r');
    cleanups.push(() => fs.closeSync(dead));
    const start = new ThreadReads('/proc', PKG_OF_CPU, 64).readStart(p.pid)!;
    await p.cmd('stop 1'); // the last started thread (b) exits: its fd now fails
    expect(p.tids()).not.toContain(b);
    // Thread a's "held" fds: b's dead stat fd and no schedstat.
    const reads = new ThreadReads('/proc', PKG_OF_CPU, 64, (_pid, tid) => (tid === a ? { stat: dead, schedstat: -1 } : undefined));
    const end = reads.readEnd(p.pid, start).threads;
    expect(end.get(a!)).toEqual(start.threads.get(a!));
    expect(end.has(b!)).toBe(false);
  });

  test('readStart keeps what readEarly read of a thread that ran in between, and reads the others', async () => {
    const p = await proc();
    await p.cmd('start 2');
    const before = p.tids();
    await p.cmd('burner');
    const burner = p.tids().find((t) => !before.includes(t))!;
    const tasks = sampler(p.pid);
    const reads = new ThreadReads('/proc', PKG_OF_CPU, 64, (pid, tid) => tasks.heldFds(pid, tid));
    const early = reads.readEarly(p.pid, [burner, p.pid]);
    expect([...early.threads.keys()]).toEqual([burner]); // the main thread is never read
    await p.cmd('burn');
    const start = reads.readStart(p.pid, early)!;
    expect(start.threads.get(burner)).toBe(early.threads.get(burner));
    expect(start.threads.size).toBe(p.tids().length - 1);
    const fresh = new ThreadReads('/proc', PKG_OF_CPU, 64).readStart(p.pid)!.threads;
    expect(fresh.get(burner)!.ticks).toBeGreaterThan(start.threads.get(burner)!.ticks);
  });

  test('readStart gives null when the process has more threads than allowed or is gone', async () => {
    const p = await proc();
    await p.cmd('start 4');
    expect(new ThreadReads('/proc', PKG_OF_CPU, 3).readStart(p.pid)).toBeNull();
    await p.kill();
    expect(new ThreadReads('/proc', PKG_OF_CPU, 64).readStart(p.pid)).toBeNull();
  });
});
