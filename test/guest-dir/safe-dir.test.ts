/**
 * SafeDir.update() (src/guest-dir/safe-dir.ts), the energy_uj writer, on real files on tmpfs: two files
 * take turns (the spare rewritten in place under a write lease, then exchanged), a file a reader
 * holds open is never rewritten, a shorter value is cut to its length, and readers in another process
 * opening and reading while values change see whole values that never go back.
 */
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { openGuestTree } from './guest-tree.js';
import { afterEach, describe, expect, it } from 'vitest';
import { SafeDir } from '../../src/guest-dir/safe-dir.js';
import { pathToFileURL } from 'node:url';
import { ensureBuilt, ROOT } from '../daemon/support/daemon-process.js';

const ZONE = 'intel-rapl:0';
const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanups.splice(0).reverse()) c();
});

const openTree = () => openGuestTree(SafeDir.open, ZONE, cleanups);

const inode = (file: string) => fs.statSync(file).ino;

describe('SafeDir.update', () => {
  it('rewrites the spare in place and swaps it in when no one holds it: two files take turns', () => {
    const { dir, file } = openTree();
    const seen: number[] = [];
    for (let i = 1; i <= 6; i++) {
      dir.update(ZONE, 'energy_uj', `${i * 1000}\n`);
      expect(fs.readFileSync(file, 'latin1')).toBe(`${i * 1000}\n`);
      seen.push(inode(file));
    }
    expect(new Set(seen.slice(1)).size).toBe(2);
    expect(seen[3]).toBe(seen[1]);
    expect(seen[4]).toBe(seen[2]);
  });

  it('never rewrites a file a reader holds open: its fd keeps the value it opened when the file is swapped out and back', () => {
    const { dir, file } = openTree();
    dir.update(ZONE, 'energy_uj', '100\n');
    dir.update(ZONE, 'energy_uj', '200\n');
    const held = fs.openSync(file, 'r');
    cleanups.push(() => fs.closeSync(held));
    const heldIno = fs.fstatSync(held).ino;
    for (let i = 3; i <= 8; i++) dir.update(ZONE, 'energy_uj', `${i}00\n`);
    const buf = Buffer.alloc(32);
    expect(buf.toString('latin1', 0, fs.readSync(held, buf, 0, 32, 0))).toBe('200\n');
    expect(fs.readFileSync(file, 'latin1')).toBe('800\n');
    // Let go of: no name leads to it any more, so it never comes back into turn.
    expect(fs.fstatSync(held).nlink).toBe(0);
    expect(inode(file)).not.toBe(heldIno);
  });

  it('cuts a shorter value (after the wrap) to its length when the spare held a longer one', () => {
    const { dir, file } = openTree();
    dir.update(ZONE, 'energy_uj', '262143328850\n');
    dir.update(ZONE, 'energy_uj', '262143328851\n');
    dir.update(ZONE, 'energy_uj', '5\n');
    expect(fs.readFileSync(file, 'latin1')).toBe('5\n');
    dir.update(ZONE, 'energy_uj', '6\n');
    expect(fs.readFileSync(file, 'latin1')).toBe('6\n');
  });

  it('lets go of a zone directory and makes it again when the owner of the guest directory moved it away', () => {
    const { dir, file } = openTree();
    dir.update(ZONE, 'energy_uj', '100\n');
    const zone = path.dirname(file);
    fs.renameSync(zone, `${zone}-moved`);
    expect(dir.audit()).toBeNull();
    expect(dir.holds(ZONE)).toBe(false);
    dir.update(ZONE, 'energy_uj', '200\n');
    expect(fs.readFileSync(file, 'latin1')).toBe('200\n');
    expect(fs.readFileSync(path.join(`${zone}-moved`, 'energy_uj'), 'latin1')).toBe('100\n');
  });

  it.each([1, 3])(
    'keeps the process alive and fails a non-blocking open with EAGAIN each time another process opens a file under its write lease (%i leases)',
    (rounds) => {
      const { file } = openTree();
      fs.mkdirSync(path.dirname(file));
      fs.writeFileSync(file, '1\n');
      // In a process of its own, so that a lease break signal that ended it would fail this test by
      // name (the signal), not the test runner's worker.
      ensureBuilt();
      const holder = spawnSync(process.execPath, ['--input-type=module', '-e', LEASE_HOLDER, file, String(rounds)], {
        encoding: 'utf8',
        timeout: 60_000 * rounds,
      });
      expect(holder.signal, `the lease holder ended by a signal: ${holder.stderr}`).toBeNull();
      expect(holder.stderr).toBe('');
      const each = <T>(v: T): T[] => Array<T>(rounds).fill(v);
      expect(JSON.parse(holder.stdout.trim())).toEqual({ leased: each(0), opener: each('EAGAIN'), dropped: each(0), heldLease: -11 });
    },
  );

  it('shows readers in another process whole values that never go back when values change as fast as they can be written', async () => {
    const { dir, file } = openTree();
    dir.update(ZONE, 'energy_uj', '0\n');
    const stop = `${file}.stop`;
    const ready = `${file}.ready`;
    // Two kinds of reading: open, read, close; and every fourth, the fd held 2 ms (hundreds of updates)
    // and read again, which must give the same value (the file it opened is never rewritten).
    const reader = spawn(process.execPath, ['-e', READER, file, stop, ready], { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    reader.stdout.on('data', (d: Buffer) => (out += d.toString()));
    const exited = new Promise((r) => reader.once('exit', r));
    const readyBy = Date.now() + 30_000;
    while (!fs.existsSync(ready)) if (Date.now() > readyBy) throw new Error('the reader process did not start in 30 s');
    // Values whose digits grow (4 to 10), so that the file's length changes too.
    const until = Date.now() + 1500;
    let i = 0;
    while (Date.now() < until) dir.update(ZONE, 'energy_uj', `${++i * 7919}\n`);
    fs.writeFileSync(stop, '');
    await exited;
    const r = JSON.parse(out) as { reads: number; held: number; bad: string[]; back: number; changed: number };
    expect(i).toBeGreaterThan(1000);
    expect(r.reads).toBeGreaterThan(100);
    expect(r.held).toBeGreaterThan(10);
    expect(r.bad).toEqual([]);
    expect(r.back).toBe(0);
    expect(r.changed).toBe(0);
  });
});

/**
 * The lease holder (argv: the file, the rounds): each round a write lease on it, another process's
 * non-blocking open (which breaks the lease: this process is signalled, SIGURG, ignored; SIGIO would
 * end it), the lease let go; then a lease refused while the file is held open. Prints what each gave.
 * Several rounds, because letting a lease go resets the file's F_SETSIG: only the first break would be SIGURG.
 */
const LEASE_HOLDER = `
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
const { closeFd } = await import(${JSON.stringify(pathToFileURL(path.join(ROOT, 'dist/src/os/libc/fds.js')).href)});
const { dropLease, O_WRONLY, openAt, takeWriteLease } = await import(${JSON.stringify(
  pathToFileURL(path.join(ROOT, 'dist/src/os/libc/dir-fd.js')).href,
)});
const [file, rounds] = process.argv.slice(1);
const fd = openAt(-100, file, O_WRONLY);
const script = "try { require('fs').openSync(process.argv[1], require('fs').constants.O_RDONLY | require('fs').constants.O_NONBLOCK); console.log('opened'); } catch (e) { console.log(e.code); }";
const leased = [], opener = [], dropped = [];
for (let k = 0; k < Number(rounds); k++) {
  leased.push(takeWriteLease(fd));
  opener.push(spawnSync(process.execPath, ['-e', script, file], { encoding: 'utf8', timeout: 30_000 }).stdout.trim());
  dropped.push(dropLease(fd));
}
const held = fs.openSync(file, 'r');
const heldLease = takeWriteLease(fd);
fs.closeSync(held);
closeFd(fd);
console.log(JSON.stringify({ leased, opener, dropped, heldLease }));
`;

/**
 * The reader process: argv file, stop, ready. Prints {reads, held, bad (texts not a whole value), back
 * (values lower than one read before), changed (held files whose value changed under their fd)}.
 */
const READER = `
const fs = require('node:fs');
const [file, stop, ready] = process.argv.slice(1);
const buf = Buffer.alloc(64);
const sleep = new Int32Array(new SharedArrayBuffer(4));
const read = (fd) => buf.toString('latin1', 0, fs.readSync(fd, buf, 0, 64, 0));
let reads = 0, held = 0, back = 0, changed = 0, last = -1;
const bad = [];
fs.writeFileSync(ready, '');
for (let k = 0; !fs.existsSync(stop); k++) {
  const fd = fs.openSync(file, 'r');
  const text = read(fd);
  if (k % 4 === 0) {
    Atomics.wait(sleep, 0, 0, 2);
    if (read(fd) !== text) changed++;
    held++;
  }
  fs.closeSync(fd);
  reads++;
  if (!/^\\d{1,13}\\n$/.test(text)) { if (bad.length < 5) bad.push(text); continue; }
  const v = Number(text);
  if (v < last) back++;
  last = v;
}
process.stdout.write(JSON.stringify({ reads, held, bad, back, changed }));
`;
