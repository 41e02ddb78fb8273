/**
 * SafeDir.update() where the two files cannot take turns (a file system without write leases or
 * RENAME_EXCHANGE; VMSR_GUEST_DIR_SWAP=0 forces that path here): each value is a new file renamed over
 * the old one, so a reader sees whole values and a file it holds never changes.
 */
import fs from 'node:fs';
import path from 'node:path';
import { openGuestTree } from './guest-tree.js';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { SafeDir as SafeDirType } from '../../src/guest-dir/safe-dir.js';

const ZONE = 'intel-rapl:0';
const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanups.splice(0).reverse()) c();
});

let SafeDir: typeof SafeDirType;
beforeAll(async () => {
  // Read once, when safe-dir.ts loads: set before this file imports it (each test file has its own modules).
  process.env.VMSR_GUEST_DIR_SWAP = '0';
  ({ SafeDir } = await import('../../src/guest-dir/safe-dir.js'));
});

const openTree = () => openGuestTree((...a) => SafeDir.open(...a), ZONE, cleanups);

describe('SafeDir.update without taking turns', () => {
  it('writes each value as a new file renamed over the old one: a held file keeps its value, the name the new one', () => {
    const { dir, file } = openTree();
    dir.update(ZONE, 'energy_uj', '100\n');
    const held = fs.openSync(file, 'r');
    cleanups.push(() => fs.closeSync(held));
    const seen = new Set<number>([fs.fstatSync(held).ino]);
    for (let i = 2; i <= 6; i++) {
      dir.update(ZONE, 'energy_uj', `${i}00\n`);
      expect(fs.readFileSync(file, 'latin1')).toBe(`${i}00\n`);
      seen.add(fs.statSync(file).ino);
    }
    // A new inode at every value (taking turns would show two), and the held one untouched, unlinked.
    expect(seen.size).toBe(6);
    const buf = Buffer.alloc(16);
    expect(buf.toString('latin1', 0, fs.readSync(held, buf, 0, 16, 0))).toBe('100\n');
    expect(fs.fstatSync(held).nlink).toBe(0);
    expect(fs.readdirSync(path.dirname(file)).filter((n) => n !== 'energy_uj' && !n.startsWith('.vmsr-'))).toEqual([]);
  });
});
