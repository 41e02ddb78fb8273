import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { SubordinateUids } from '../../src/os/subordinate-uids.js';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmsr-subuid-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));
const subuid = path.join(dir, 'subuid');
const passwd = path.join(dir, 'passwd');
fs.writeFileSync(passwd, 'root:x:0:0::/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\nbob:x:1001:1001::/home/bob:/bin/sh\n');

describe('subordinate uids', () => {
  test('every uid of a range is its user, whatever the range, and uids outside every range are themselves', () => {
    for (const [start, count] of [
      [100000, 65536],
      [1, 1],
      [231072, 1_000_000],
      [0xffffffff - 100, 10],
    ] as const) {
      fs.writeFileSync(subuid, `# a comment\nalice:${start}:${count}\n1001:${start + count}:5\nnobody-here:${start + count + 5}:3\n`);
      const s = new SubordinateUids(subuid, passwd);
      expect([s.ownerOf(start), s.ownerOf(start + count - 1), s.ownerOf(start + Math.floor(count / 2))]).toEqual([1000, 1000, 1000]);
      // A numeric name is a uid; a name that is no user makes its range one owner, its first uid.
      expect([s.ownerOf(start + count), s.ownerOf(start + count + 4)]).toEqual([1001, 1001]);
      expect(s.ownerOf(start + count + 7)).toBe(start + count + 5);
      if (start > 1) expect(s.ownerOf(start - 1)).toBe(start - 1);
      expect(s.ownerOf(1000)).toBe(1000);
    }
  });

  test('a changed file applies at the next look; a missing one or lines that are not NAME:START:COUNT give no range', () => {
    fs.writeFileSync(subuid, 'alice:100000:65536\n');
    const s = new SubordinateUids(subuid, passwd);
    expect(s.ownerOf(100001)).toBe(1000);
    fs.writeFileSync(subuid, 'bob:100000:65536\nalice:500000:10\n');
    expect([s.ownerOf(100001), s.ownerOf(500009)]).toEqual([1001, 1000]);
    fs.writeFileSync(subuid, 'alice:100000\nalice:x:5\nalice:100000:0\nalice:4294967290:100\n:1:2\nalice:100000:65536:9\n');
    expect([s.ownerOf(100001), s.ownerOf(4294967291)]).toEqual([100001, 4294967291]);
    fs.rmSync(subuid);
    expect(new SubordinateUids(subuid, passwd).ownerOf(100001)).toBe(100001);
  });
});
