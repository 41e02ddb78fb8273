import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { MAX_PROC_FILE_BYTES, readProcFile } from '../../src/os/proc-file.js';

describe('readProcFile', () => {
  it('reads a /proc file (size 0 to stat) whole, the same text readFileSync gives', () => {
    for (const f of [`/proc/${process.pid}/stat`, '/proc/self/status', '/proc/self/maps']) {
      // maps and status may change between two reads of a live process: compare their shape
      const ours = readProcFile(f);
      const theirs = fs.readFileSync(f, 'latin1');
      if (f.endsWith('stat')) expect(ours.split(' ').slice(0, 5)).toEqual(theirs.split(' ').slice(0, 5));
      else expect(ours.split('\n')[0]).toBe(theirs.split('\n')[0]);
      expect(ours.endsWith('\n')).toBe(true);
    }
  });

  it('reads a file longer than its buffer whole, utf8 when asked, and the next short read is not polluted', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-procfile-'));
    try {
      const long = path.join(dir, 'long');
      const text = 'é'.repeat(20_000) + '\n';
      fs.writeFileSync(long, text);
      expect(readProcFile(long, 'utf8')).toBe(text);
      const short = path.join(dir, 'short');
      fs.writeFileSync(short, 'ab\n');
      expect(readProcFile(short)).toBe('ab\n');
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('refuses a file longer than MAX_PROC_FILE_BYTES and throws ENOENT for a missing one', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-procfile-'));
    try {
      const big = path.join(dir, 'big');
      fs.writeFileSync(big, Buffer.alloc(MAX_PROC_FILE_BYTES + 1, 0x41));
      expect(() => readProcFile(big)).toThrow(/longer than 1048576 bytes/);
      expect(() => readProcFile(path.join(dir, 'nope'))).toThrow(/ENOENT/);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
