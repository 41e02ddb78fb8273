/**
 * The guest directories' inotify queue (src/guest-dir/dir-watch.ts) on real directories on tmpfs:
 * what marks a directory changed and what does not, an overflowed queue, and the publisher refusing a
 * directory at the next sample when something hostile is planted in it after it was published (the
 * queue tells it, with no fstat per directory and sample).
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import pino from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { DirWatch } from '../../src/guest-dir/dir-watch.js';
import { GuestDirs, type GuestDirSource } from '../../src/guest-dir/guest-dirs.js';
import { O_DIRECTORY, O_RDONLY, openAt } from '../../src/os/libc/dir-fd.js';
import { closeFd } from '../../src/os/libc/fds.js';
import { encodeStatsFile } from '../../src/protocol/stats/layout.js';
import { vmStatsLayout } from '../../src/protocol/stats/vm-file.js';
import { emptyVmTotals } from '../../src/ratio/outputs.js';

const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanups.splice(0).reverse()) c();
});

/** A new directory on tmpfs (where the host puts DIR), removed after the test. */
function tmpRoot(): string {
  const shm = fs.existsSync('/dev/shm') ? '/dev/shm' : os.tmpdir();
  const root = fs.mkdtempSync(path.join(shm, 'vmsr-dir-watch-'));
  cleanups.push(() => fs.rmSync(root, { recursive: true, force: true }));
  return root;
}

function openDir(p: string): number {
  const fd = openAt(-100, p, O_RDONLY | O_DIRECTORY);
  if (fd < 0) throw new Error(`cannot open ${p}: errno ${-fd}`);
  cleanups.push(() => closeFd(fd));
  return fd;
}

function newWatch(): DirWatch {
  const w = DirWatch.open();
  if (w === null) throw new Error('cannot make an inotify instance here (inotify_init1 failed)');
  cleanups.push(() => w.close());
  return w;
}

describe('DirWatch', () => {
  it('marks a directory changed when an entry is made, renamed, removed or its attributes change, and not for what changes inside its subdirectories', () => {
    const root = tmpRoot();
    const a = path.join(root, 'a');
    fs.mkdirSync(path.join(a, 'zone'), { recursive: true });
    const w = newWatch();
    const wd = w.add(openDir(a))!;
    expect(wd).not.toBeNull();
    const after = (what: string, change: () => void, expected: boolean) => {
      w.dirty.delete(wd);
      change();
      w.drain();
      expect(w.dirty.has(wd), what).toBe(expected);
    };
    after('nothing', () => {}, false);
    after('a file written inside a subdirectory', () => fs.writeFileSync(path.join(a, 'zone', 'energy_uj'), '1\n'), false);
    after('an entry made', () => fs.writeFileSync(path.join(a, 'x'), ''), true);
    after('a symlink made', () => fs.symlinkSync('/etc/shadow', path.join(a, 'link')), true);
    after('a hard link made', () => fs.linkSync(path.join(a, 'x'), path.join(a, 'y')), true);
    after('an entry renamed', () => fs.renameSync(path.join(a, 'y'), path.join(a, 'z')), true);
    after('an entry removed', () => fs.unlinkSync(path.join(a, 'z')), true);
    after("an entry's mode changed", () => fs.chmodSync(path.join(a, 'x'), 0o600), true);
    after('its own mode changed', () => fs.chmodSync(a, 0o700), true);
    after('a subdirectory moved away', () => fs.renameSync(path.join(a, 'zone'), path.join(root, 'zone')), true);
    after('itself moved', () => fs.renameSync(a, path.join(root, 'moved')), true);
  });

  it('marks every directory changed when the queue overflowed, and only the changed one otherwise', () => {
    const root = tmpRoot();
    for (const d of ['a', 'b']) fs.mkdirSync(path.join(root, d));
    const w = newWatch();
    const a = w.add(openDir(path.join(root, 'a')))!;
    const b = w.add(openDir(path.join(root, 'b')))!;
    const files = ['f', 'g'].map((f) => path.join(root, 'a', f));
    for (const f of files) fs.writeFileSync(f, '');
    w.drain();
    expect([w.dirty.has(a), w.dirty.has(b)]).toEqual([true, false]);
    w.dirty.delete(a);
    // More events than the queue holds (max_queued_events, 16384 by default): the overflow event is all
    // that is left of the rest. Two files in turn: the kernel merges an event equal to the one before.
    const max = Number(fs.readFileSync('/proc/sys/fs/inotify/max_queued_events', 'latin1'));
    for (let i = 0; i <= max + 10; i++) fs.utimesSync(files[i % 2]!, i, i);
    w.drain();
    expect([w.dirty.has(a), w.dirty.has(b)]).toEqual([true, true]);
  });
});

describe('GuestDirs with the inotify queue', () => {
  it('refuses a published directory at the next sample when a symlink is planted in it, and never writes through it', () => {
    const root = tmpRoot();
    const vmDir = path.join(root, 'vm-0');
    fs.mkdirSync(vmDir);
    const shape = { hostVmId: 1, pid: 1, name: 'x', nvpkg: 1, nvcpu: 1, tickExponent: -2, domains: [] };
    const source: GuestDirSource = {
      vms: () => [{ vmId: 0, uuid: null, name: 'vm-0', pid: process.pid, uid: process.geteuid?.() ?? 0, live: true }],
      statsCopy: (_vmId, map) => {
        map(encodeStatsFile(vmStatsLayout(shape)));
        return { shape, totals: { ...emptyVmTotals(), energyUj: [0] }, current: true, valuesWritten: 0, close: () => {} };
      },
      inGroup: () => false,
      readers: (uid) => ({ uid, gid: null }),
    };
    let logged = '';
    const log = pino(
      { level: 'warn' },
      new Writable({
        write: (chunk: Buffer, _enc, done) => {
          logged += chunk.toString();
          done();
        },
      }),
    );
    const g = new GuestDirs(root, source, log);
    cleanups.push(() => g.close());
    // Published, and settled (its own first files seen by the next check).
    for (let i = 0; i < 3; i++) g.sample();
    expect(fs.existsSync(path.join(vmDir, 'intel-rapl:0', 'energy_uj'))).toBe(true);
    expect(logged).toBe('');
    const target = path.join(root, 'outside');
    fs.writeFileSync(target, 'untouched');
    fs.symlinkSync(target, path.join(vmDir, 'planted'));
    g.sample();
    expect(logged).toContain('cannot publish into');
    expect(logged).toContain('a symlink');
    expect(fs.readFileSync(target, 'latin1')).toBe('untouched');
  });
});
