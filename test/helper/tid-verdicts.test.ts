/**
 * The per-connection tid verdicts of the legacy path: a YES is reused for at most the stated bound,
 * so a thread that exited, or a tid the kernel handed to another process, is refused once it passes.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { TID_VERDICT_MAX_AGE_MS, TID_VERDICTS_PER_CONNECTION, TidVerdicts } from '../../src/helper/legacy/tid-verdicts.js';
import { ThreadedProcess } from '../support/threads.js';

/** A /proc whose task directories the test creates and removes, with a clock it moves by hand. */
class FakeProc {
  readonly root = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-tidv-'));
  t = 1000;
  readonly clock = (): number => this.t;
  add(pid: number, tid: number): void {
    fs.mkdirSync(path.join(this.root, String(pid), 'task', String(tid)), { recursive: true });
  }
  remove(pid: number, tid: number): void {
    fs.rmSync(path.join(this.root, String(pid), 'task', String(tid)), { recursive: true });
  }
  cleanup(): void {
    fs.rmSync(this.root, { recursive: true, force: true });
  }
}

const fakes: FakeProc[] = [];
function fakeProc(): FakeProc {
  const f = new FakeProc();
  fakes.push(f);
  return f;
}
const procs: ThreadedProcess[] = [];
afterEach(async () => {
  for (const f of fakes.splice(0)) f.cleanup();
  for (const p of procs.splice(0)) await p.kill();
});

describe('TidVerdicts', () => {
  test('a thread that exits is refused once the bound has passed since the check that saw it', () => {
    const f = fakeProc();
    f.add(100, 101);
    const v = new TidVerdicts(f.root, 100, f.clock);
    expect(v.belongs(101)).toBe(true);
    f.remove(100, 101);
    f.t += TID_VERDICT_MAX_AGE_MS - 1;
    expect(v.belongs(101)).toBe(true); // within the bound: the remembered YES
    f.t += 1;
    expect(v.belongs(101)).toBe(false); // bound reached: /proc asked again
    f.t += 1;
    expect(v.belongs(101)).toBe(false);
  });

  test('a tid reused by another process is refused to the first peer after the bound, and is the new owner’s at once', () => {
    const f = fakeProc();
    f.add(100, 101);
    const first = new TidVerdicts(f.root, 100, f.clock);
    const second = new TidVerdicts(f.root, 200, f.clock);
    expect(first.belongs(101)).toBe(true);
    expect(second.belongs(101)).toBe(false);
    // The thread exits and the kernel gives its number to a thread of process 200.
    f.remove(100, 101);
    f.add(200, 101);
    expect(second.belongs(101)).toBe(true); // a NO was not remembered
    f.t += TID_VERDICT_MAX_AGE_MS;
    expect(first.belongs(101)).toBe(false);
    expect(second.belongs(101)).toBe(true);
  });

  test('a YES is re-checked against /proc every bound, not once', () => {
    const f = fakeProc();
    f.add(100, 101);
    const v = new TidVerdicts(f.root, 100, f.clock);
    for (let i = 0; i < 5; i++) {
      expect(v.belongs(101)).toBe(true);
      f.t += TID_VERDICT_MAX_AGE_MS;
    }
    f.remove(100, 101);
    expect(v.belongs(101)).toBe(false);
  });

  test('a clock that goes backwards re-checks instead of extending the verdict', () => {
    const f = fakeProc();
    f.add(100, 101);
    const v = new TidVerdicts(f.root, 100, f.clock);
    expect(v.belongs(101)).toBe(true);
    f.remove(100, 101);
    f.t -= 5;
    expect(v.belongs(101)).toBe(false);
  });

  test('tid 0, negative and beyond pid_t are refused; memory stays bounded whatever tids a client sends', () => {
    const f = fakeProc();
    for (let tid = 1; tid <= TID_VERDICTS_PER_CONNECTION + 50; tid++) f.add(100, tid);
    const v = new TidVerdicts(f.root, 100, f.clock);
    for (const bad of [0, -1, 0x40000000, 2 ** 32 - 1, 1.5]) expect(v.belongs(bad)).toBe(false);
    for (let tid = 1; tid <= TID_VERDICTS_PER_CONNECTION + 50; tid++) {
      expect(v.belongs(tid)).toBe(true);
      expect(v.size).toBeLessThanOrEqual(TID_VERDICTS_PER_CONNECTION);
    }
  });

  test('on real threads: an exited thread is refused within the bound', async () => {
    const p = new ThreadedProcess();
    procs.push(p);
    await p.ready();
    await p.cmd('start 1');
    const tid = p.tids().find((t) => t !== p.pid)!;
    const v = new TidVerdicts('/proc', p.pid);
    expect(v.belongs(tid)).toBe(true);
    expect(v.belongs(p.pid)).toBe(true);
    expect(v.belongs(process.pid)).toBe(false);
    await p.cmd('stop 1');
    expect(fs.existsSync(`/proc/${p.pid}/task/${tid}`)).toBe(false);
    await new Promise((r) => setTimeout(r, TID_VERDICT_MAX_AGE_MS + 20));
    expect(v.belongs(tid)).toBe(false);
    expect(v.belongs(p.pid)).toBe(true);
  });
});
