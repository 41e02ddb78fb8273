/**
 * The schedstat thread gate's one reading of a run time (os/schedstat-gate.ts), which the sampler's
 * task reads and the guest energy's window reads share: what it takes as a run time and what it
 * refuses, on files of every shape a schedstat could have, and on this process's own threads.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { digits, readRunTime, SCHEDSTAT_BYTES } from '../../src/os/schedstat-gate.js';
import { ThreadReads } from '../../src/helper/guest/thread-reads.js';

function withFile<T>(text: string, f: (fd: number) => T): T {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-schedstat-'));
  const file = path.join(dir, 'schedstat');
  fs.writeFileSync(file, text, 'latin1');
  const fd = fs.openSync(file, 'r');
  try {
    return f(fd);
  } finally {
    fs.closeSync(fd);
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

describe('readRunTime', () => {
  const buf = Buffer.alloc(SCHEDSTAT_BYTES);

  it('gives the run time digits when the first field is a u64 followed by a space, whatever its length up to 20 digits', () => {
    for (const run of ['1', '9', '10', '123456789', '1234567890123', '18446744073709551615']) {
      const len = withFile(`${run} 77 3\n`, (fd) => readRunTime(fd, buf));
      expect(len).toBe(run.length);
      expect(buf.toString('latin1', 0, len)).toBe(run);
    }
    expect(withFile('4096 0 0\n', (fd) => digits(buf, 0, readRunTime(fd, buf)))).toBe(4096);
  });

  it('refuses (0) a first field that cannot gate: "0" (sched_info off), not digits, over 20 digits, or with nothing after it', () => {
    for (const text of ['0 0 0\n', '', ' 12 3 4\n', '12a 3 4\n', '-5 1 1\n', `${'1'.repeat(21)} 1 1\n`, '12345', '1.5 2 3\n'])
      expect(
        withFile(text, (fd) => readRunTime(fd, buf)),
        JSON.stringify(text),
      ).toBe(0);
  });

  it('gives -errno when the fd cannot be read (closed)', () => {
    const fd = withFile('5 5 5\n', (f) => f);
    expect(readRunTime(fd, buf)).toBe(-os.constants.errno.EBADF);
  });

  it("reads this process's threads' schedstat as /proc prints it, when the kernel has one", (ctx) => {
    const file = `/proc/self/task/${process.pid}/schedstat`;
    if (!fs.existsSync(file)) return ctx.skip(`${file} does not exist (no CONFIG_SCHED_INFO)`);
    const fd = fs.openSync(file, 'r');
    try {
      const len = readRunTime(fd, buf);
      const first = fs.readFileSync(file, 'latin1').split(' ')[0]!;
      if (first === '0') expect(len).toBe(0);
      else expect(len).toBeGreaterThan(0);
    } finally {
      fs.closeSync(fd);
    }
  });
});

describe('ThreadReads with the gate', () => {
  it('reads no run time (null) when the held schedstat says 0 0 0, so a thread is never kept on it', () => {
    withFile('0 0 0\n', (fd) => {
      const reads = new ThreadReads('/proc', new Map(), 64, () => ({ stat: -1, schedstat: fd }));
      expect(reads.runTimeNs(1, 2)).toBeNull();
    });
    withFile('2500 1 1\n', (fd) => {
      const reads = new ThreadReads('/proc', new Map(), 64, () => ({ stat: -1, schedstat: fd }));
      expect(reads.runTimeNs(1, 2)).toBe(2500);
    });
  });
});
